"""Data parallelism for a model whose experts are sharded (chapter 18; labs 12 and 16).

The property: gradients are sums, and a weight's gradient is summed over the ranks that hold a copy
of it. A dense weight is copied on every rank of the data group (dp x ep x cp: all split the tokens);
an expert's weight only on the ranks with its ep coordinate (dp x cp, the expert group). So two
reducers, plain DDP or ZeRO-1/2 each, run side by side. Both launch their collectives when the
backward is over, in a fixed order: an expert that received no token produces no gradient on one rank
and one on another, and hook-driven launches would run one group's collectives in different orders.

An expert that no token reached anywhere gets no gradient, and like torch's optimizers the step then
leaves it alone; its parameters are bucketed apart from other experts' so that it is whole pieces to skip.
"""

from __future__ import annotations

import re
from contextlib import contextmanager

from minidist import dist
from minidist.nn.moe import idle_expert_params, is_expert_param
from minidist.parallel.data.data_parallel import DataParallel, make_buckets
from minidist.parallel.data.zero import ZeroOptimizer


def expert_buckets(named: list, bucket_bytes: float) -> list[list]:
    """Buckets that never mix two experts, so an expert no token reached is whole pieces to skip."""
    by_expert: dict[str, list] = {}
    for n, p in named:
        by_expert.setdefault(n[:re.search(r"(^|\.)experts\.\d+\.", n).end()], []).append((n, p))
    return [b for group in reversed(list(by_expert.values())) for b in make_buckets(group, bucket_bytes)]


class ExpertDataParallel:
    """Data parallelism with two reducers, dense weights over the data group and experts over the expert
    group, both launched at the end of the backward in a fixed order; plain DDP or ZeRO-1/2 in each.
    The same interface as :class:`DataParallel`."""

    accumulates_locally = True

    def __init__(self, named: list, bucket_bytes: float, dense_group, expert_group, algorithm: str | None,
                 zero_stage: int = 0, alone: tuple[str, ...] = ()) -> None:
        dense = [(n, p) for n, p in named if not is_expert_param(n)]
        experts = [(n, p) for n, p in named if is_expert_param(n)]
        me = dist.get_rank()

        def reducer(params, group, **kw):
            args = (params, bucket_bytes, group, group.size(), group.group_rank(me), algorithm)
            return ZeroOptimizer(zero_stage, *args, **kw) if zero_stage else DataParallel(*args, **kw)

        self.parts = [reducer(dense, dense_group, buckets=make_buckets(dense, bucket_bytes, alone))]
        if experts:
            self.parts.append(reducer(experts, expert_group, buckets=expert_buckets(experts, bucket_bytes),
                                      name="expert_bucket"))
        for part in self.parts:
            part.sync = False  # no hook-driven launches: finish() reduces every bucket in order

    def setup(self, ledger, state_bytes: dict) -> None:
        for part in self.parts:
            part.setup(ledger, state_bytes)

    @contextmanager
    def no_sync(self):
        yield  # the parts never reduce during a backward anyway

    def finish(self) -> None:
        for part in self.parts:
            part.finish()

    def pieces(self) -> list:
        return [piece for part in self.parts for piece in part.pieces()]

    def piece_names(self) -> list[list[str]]:
        return [piece for part in self.parts for piece in part.piece_names()]

    def piece_layout(self) -> list[list[tuple[str, int, int, int]]]:
        return [piece for part in self.parts for piece in part.piece_layout()]

    def skipped(self, model) -> frozenset[int]:
        """Indices into :meth:`pieces` of the experts no token reached: no gradient, so no update."""
        idle = idle_expert_params(model)
        names = self.piece_names()
        return frozenset(i for i, piece in enumerate(names) if all(n in idle for n in piece))

    def after_step(self, model) -> None:
        for part in self.parts:  # ZeRO: every rank updated its slice, an all-gather hands it to the others
            part.after_step(model)

    def grad_state(self) -> dict:
        states = [part.grad_state() for part in self.parts]
        if all("full" in st for st in states):
            return {"full": {k: v for st in states for k, v in st["full"].items()}}
        return {"shards": {k: v for st in states for k, v in st["shards"].items()},
                "meta": [u for st in states for u in st["meta"]]}

    def param_state(self) -> dict:
        return {"full": {k: v for part in self.parts for k, v in part.param_state()["full"].items()}}
