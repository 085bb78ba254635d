"""How one rank runs the micro-batches of a step: one after another, or as a pipeline schedule.

Gradients are sums, so a step's gradient is the sum of its micro-batches' gradients, each loss scaled
by its micro-batch's share of the global batch (chapter 14's gradient accumulation). Without a pipeline
the micro-batches run one after another and the data-parallel reducer stays quiet until the last one
(``no_sync``) when it accumulates locally; with a pipeline (chapter 16) the schedule interleaves the
stages' forwards and backwards and the reducer runs once the pipeline has flushed. Either way ``run``
leaves the reduced gradient with the reducer and returns this rank's share of the loss.

An MoE layer's routing statistics are those of the micro-batch it sees: before each micro-batch's forward
(and a pipeline's backward, which may recompute it) the engine ``select``s it in the rank's batch share,
and each step opens the sum of routing loads its bias update and idle experts read (``moe.begin_step``).
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from minidist import dist
from minidist.collectives import offered
from minidist.nn.moe import begin_step


class MicroBatches:
    """Gradient accumulation through a :class:`~minidist.parallel.runner.Runner`."""

    def __init__(self, runner, reducer, select=None) -> None:
        self.runner, self.reducer, self.select = runner, reducer, select

    def run(self, xs: list[np.ndarray], ys: list[np.ndarray], weights: list[float]) -> float:
        local, quiet_ok = 0.0, self.reducer.accumulates_locally
        begin_step(self.runner.model)
        for i, (x, y, w) in enumerate(zip(xs, ys, weights)):
            last = i == len(xs) - 1
            if self.select is not None:
                self.select(i)
            with self.reducer.no_sync() if (not last and quiet_ok) else nullcontext():
                loss = self.runner.loss(x, y)
                self.runner.backward(loss, w)
            if last or not quiet_ok:
                self.reducer.finish()
            local += float(loss.data) * w
        return local


class PipelineEngine:
    """A pipeline schedule over this rank's stage (:class:`~minidist.parallel.pipeline.executor.PipelineExecutor`).

    ``ends``: with tied embeddings, the group of this pipeline's first and last stage, which both hold
    the embedding matrix: the loss depends on it through both uses, so after each stage has reduced
    its gradient over its data-parallel group, the two are summed (one piece, laid out alike on both).
    """

    def __init__(self, executor, schedule, reducer, ends=None, algorithm: str | None = None) -> None:
        self.executor, self.schedule, self.reducer = executor, schedule, reducer
        self.ends, self.algorithm = ends, algorithm

    def run(self, xs: list[np.ndarray], ys: list[np.ndarray], weights: list[float]) -> float:
        begin_step(self.executor.model)
        with self.reducer.no_sync():
            loss = self.executor.run(self.schedule, xs, ys, weights)
        self.reducer.finish()
        if self.ends is not None:
            grad = self.reducer.pieces()[self.reducer.piece_names().index(["wte.weight"])][1]
            dist.all_reduce(grad, group=self.ends, algorithm=offered("all_reduce", self.algorithm))
        return loss
