"""Measuring the best checkpoint interval on simulated devices (chapter 26, lab 17).

Young and Daly derive the interval that balances the cost of writing checkpoints against the work a
failure throws away. Here it is measured instead: the same training run, under the same failure process
(same seeds, so every interval meets the same failures at the same simulated times), is repeated with a
checkpoint every k steps, and the overhead ``total time / failure-free compute time - 1`` is recorded for
each k. The measured curve is then fitted by ``a / k + b k + c`` (the shape of the first-order model:
checkpoint cost per interval, half an interval lost per failure, a constant restart cost), whose minimum
``sqrt(a / b)`` is the measured optimum. Failures are survived in place (every rank rolls back to the
newest checkpoint inside one launch), so a sweep costs no new processes.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

import numpy as np

from minidist.parallel.config import ParallelConfig
from minidist.parallel.options import Resilience
from minidist.parallel.train import train
from minidist.resilience.failures import Faults


@dataclass(frozen=True)
class SweepPoint:
    """One run of the sweep: a checkpoint every ``every`` steps under the failures of ``seed``."""

    every: int
    seed: int
    total: float  # simulated seconds from start to end: compute, checkpoints, lost work, restarts
    work: float  # simulated seconds of the same steps without checkpoints or failures
    failures: int
    lost: float

    @property
    def overhead(self) -> float:
        return self.total / self.work - 1.0


def checkpoint_cost(model_config, layout: ParallelConfig | None = None, cluster=None, global_batch: int = 2,
                    steps: int = 6) -> tuple[float, float]:
    """``(step, checkpoint)``: simulated seconds of one training step, and of what one checkpoint blocks a
    step (copy out, write, publish), measured on a short run of the same model, layout and cluster."""
    layout = layout or ParallelConfig()
    plain = train(model_config, layout, steps=steps, global_batch=global_batch, cluster=cluster)
    with tempfile.TemporaryDirectory() as d:
        saved = train(model_config, layout, steps=steps, global_batch=global_batch, cluster=cluster,
                      resilience=Resilience(d, every=1))
    return float(np.mean(plain.time[1:])), max(saved.checkpoint_blocked) / steps


def sweep_checkpoint_interval(model_config, intervals, mtbf: float, steps: int, seeds=(0,),
                              layout: ParallelConfig | None = None, cluster=None, global_batch: int = 2,
                              restart_seconds: float = 0.0, progress=None) -> list[SweepPoint]:
    """Train ``steps`` steps with a checkpoint every k steps for each k in ``intervals``, under failures of
    MTBF ``mtbf`` simulated seconds drawn from each seed; ``progress(done, total)`` is called after each run."""
    layout = layout or ParallelConfig()
    base = train(model_config, layout, steps=steps, global_batch=global_batch, cluster=cluster)
    work = float(sum(base.time))
    points, runs = [], [(k, s) for s in seeds for k in intervals]
    for i, (k, seed) in enumerate(runs):
        with tempfile.TemporaryDirectory() as d:
            r = train(model_config, layout, steps=steps, global_batch=global_batch, cluster=cluster,
                      resilience=Resilience(d, every=int(k), restart=True, faults=Faults(
                          mtbf=mtbf, seed=seed, in_place=True, restart_seconds=restart_seconds)))
        if not all(np.array_equal(r.params[n], base.params[n]) for n in base.params):
            raise AssertionError(f"sweep: the run with checkpoints every {k} steps did not end where the "
                                 f"failure-free run ends")
        points.append(SweepPoint(int(k), seed, r.total_time, work, len(r.failures), r.lost_time))
        if progress is not None:
            progress(i + 1, len(runs))
    return points


def fitted_optimum(points: list[SweepPoint]) -> float:
    """The interval (steps) minimising the least-squares fit ``a / k + b k + c`` of the mean overheads."""
    ks = sorted({p.every for p in points})
    mean = np.array([np.mean([p.overhead for p in points if p.every == k]) for k in ks])
    k = np.array(ks, dtype=float)
    a, b, _ = np.linalg.lstsq(np.c_[1 / k, k, np.ones_like(k)], mean, rcond=None)[0]
    if a <= 0 or b <= 0:
        raise ValueError(f"fitted_optimum: the overheads {dict(zip(ks, mean.round(4)))} have no interior minimum "
                         f"(fit a={a:.3g}, b={b:.3g}); widen the sweep")
    return float(np.sqrt(a / b))
