"""Data parallelism, DDP style (chapter 14, lab 08).

The property: the gradient of a mean loss over a batch is the weighted sum of the gradients over
its parts, grad L_B = sum_i (|B_i| / |B|) grad L_{B_i}, because differentiation is linear and the
sum is associative. So each replica differentiates its own shard with its loss scaled by its share
``|B_i| / |B|`` (uneven shards included), the shards' gradients are summed by an all-reduce, and
every replica applies the identical update to identical weights (they start identical because rank
0 broadcasts them), so replicas stay bitwise equal forever.

Bucketing: gradients become final in roughly reverse layer order during the backward. Parameters
are grouped, in reverse registration order, into buckets of about ``bucket_bytes``; the moment a
bucket's last gradient is accumulated (a post-accumulate hook) its all-reduce starts
asynchronously on the comm stream while the backward of earlier layers continues on the compute
stream. All are waited before the optimizer step. ``no_sync`` (gradient accumulation) skips the
all-reduce on every micro-batch but the last: gradients simply add up locally in ``.grad``. The
buckets are the gradients' only storage: each parameter's ``.grad`` becomes a view of its slot in
its bucket as soon as the backward has produced it, so a replica holds its gradients once.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from minidist import dist
from minidist.collectives import offered
from minidist.parallel.data.flat import FlatUnit
from minidist.parallel.runner import Hooks


def make_buckets(named_params: list, bucket_bytes: float, alone: tuple[str, ...] = ()) -> list[list]:
    """``(name, param)`` pairs in reverse order, cut into consecutive groups of about ``bucket_bytes``.

    Parameters named in ``alone`` get a bucket each, first: a weight two pipeline stages share (tied
    embeddings) then has the same shard layout on both, so its reduced gradient can be summed across them."""
    buckets, cur, size = [[(n, p)] for n, p in named_params if n in alone], [], 0
    for name, p in reversed([(n, p) for n, p in named_params if n not in alone]):
        cur.append((name, p))
        size += p.data.nbytes
        if size >= bucket_bytes:
            buckets.append(cur)
            cur, size = [], 0
    if cur:
        buckets.append(cur)
    return buckets


class BucketedReducer(Hooks):
    """Gradient buckets of one model replica, reduced over ``group`` as soon as each is complete.

    ``collective(unit, flat)`` is what a full bucket triggers (all-reduce here; ZeRO replaces it by a
    reduce-scatter) and returns a Work or None. Buckets are :class:`FlatUnit` s padded to a multiple
    of the group size, so ring algorithms split them into equal chunks.
    """

    def __init__(self, named_params: list, bucket_bytes: float, group, dp: int, dp_rank: int,
                 algorithm: str | None = None, buckets: list[list] | None = None, name: str = "bucket") -> None:
        """``buckets``: the parameters already cut into buckets (default: ``make_buckets``); ``name``: the
        prefix of the buckets' unit names (two reducers in one rank need different ones)."""
        self.group, self.dp, self.algorithm = group, dp, algorithm
        cut = make_buckets(named_params, bucket_bytes) if buckets is None else buckets
        self.units = [FlatUnit(f"{name}.{i}", b, dp, dp_rank) for i, b in enumerate(cut)]
        # Weights and gradients of a bucket live in flat buffers; each parameter's .data becomes a view.
        self.pflats = [u.flatten([p.data for p in u.params]) for u in self.units]
        for u, flat in zip(self.units, self.pflats):
            for p, v in zip(u.params, u.views(flat)):
                p.data = v
        self.flats: list[np.ndarray | None] = [u.empty() for u in self.units]
        self.sync = True
        self._pending: list[int] = []
        self._works: list = []
        self._launched: list[bool] = []
        self._slots: dict[tuple[int, int], np.ndarray] = {}  # the bucket views .grad points at
        for ui, u in enumerate(self.units):
            for pi, p in enumerate(u.params):
                p.register_post_accumulate_grad_hook(lambda p, ui=ui, pi=pi: self._ready(ui, pi, p))
        self.reset()

    def reset(self) -> None:
        self._pending = [len(u.params) for u in self.units]
        self._launched = [False] * len(self.units)
        self._works = []

    @contextmanager
    def no_sync(self):
        """Accumulate gradients locally: no communication in backwards run inside this block."""
        previous, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = previous

    def _ready(self, ui: int, pi: int, p) -> None:
        self._into_bucket(ui, pi, p)
        if not self.sync:
            return
        self._pending[ui] -= 1
        if self._pending[ui] == 0:
            self._launch(ui)

    def _bucket(self, ui: int) -> np.ndarray:
        """Bucket ``ui``'s gradient buffer, where a parameter's gradient goes once the backward computed it."""
        return self.flats[ui]

    def _into_bucket(self, ui: int, pi: int, p) -> None:
        """The gradients live in the buckets, once: a parameter's fresh ``.grad`` is copied into its slot and
        ``.grad`` becomes a view of the slot (later micro-batches add into it in place), so no second full-size
        copy of the gradients stays alive beside the buckets (PyTorch's ``gradient_as_bucket_view``)."""
        if p.grad is None or p.grad is self._slots.get((ui, pi)):
            return
        u, flat = self.units[ui], self._bucket(ui)
        slot = flat[u.offsets[pi]:u.offsets[pi + 1]].reshape(u.shapes[pi])
        slot[...] = p.grad
        p.grad = self._slots[ui, pi] = slot

    def _launch(self, ui: int) -> None:
        u = self.units[ui]
        flat = self._bucket(ui)
        for pi, (p, slot) in enumerate(zip(u.params, u.views(flat))):
            if p.grad is None:
                slot[...] = 0
            elif p.grad is not self._slots.get((ui, pi)):
                slot[...] = p.grad
        flat[u.numel:] = 0
        self._launched[ui] = True
        work = self.collective(u, flat)
        if work is not None:
            self._works.append(work)

    def collective(self, unit: FlatUnit, flat: np.ndarray):
        if self.dp == 1:
            return None
        return dist.all_reduce(flat, group=self.group, async_op=True, algorithm=offered("all_reduce", self.algorithm))

    def broadcast_weights(self) -> None:
        """Replicas start from rank 0's weights (the invariant's base case)."""
        if self.dp > 1:
            src = self.group.global_rank(0)
            for flat in self.pflats:
                dist.broadcast(flat, src, group=self.group, algorithm=offered("broadcast", self.algorithm))

    def finish(self) -> None:
        """After the last backward: reduce buckets no hook completed (unused parameters), wait for all."""
        for ui in range(len(self.units)):
            if not self._launched[ui]:
                self._launch(ui)
        for w in self._works:
            w.wait()
        self.reset()


class DataParallel(BucketedReducer):
    """DDP: replicated weights, bucketed asynchronous all-reduce of gradients (ZeRO stage 0)."""

    def setup(self, ledger, state_bytes: dict) -> None:
        """Broadcast rank 0's weights to every replica and book the buffers it holds: the flat weights and the
        gradient buckets (the gradients' only storage); the optimizer books its state when it creates it."""
        self.broadcast_weights()
        ledger.alloc("params", sum(f.size for f in self.pflats) * state_bytes["params"])
        ledger.alloc("grads", sum(f.size for f in self.flats) * state_bytes["grads"])

    accumulates_locally = True

    def piece_names(self) -> list[list[str]]:
        """The parameter names behind each of :meth:`pieces` (one each here)."""
        return [[n] for u in self.units for n in u.names]

    def piece_layout(self) -> list[list[tuple[str, int, int, int]]]:
        """Per piece, which parameter elements it holds (see ``FlatUnit.segments``): here each one whole."""
        return [[(n, 0, size, 0)] for u in self.units for n, size in zip(u.names, u.sizes)]

    def pieces(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(weight, averaged gradient) pairs the optimizer updates: every parameter, whole."""
        out = []
        for u, flat in zip(self.units, self.flats):
            out.extend(zip((p.data for p in u.params), u.views(flat)))
        return out

    def after_step(self, model) -> None:
        model.zero_grad()

    def grad_state(self) -> dict:
        """The averaged gradient by name (every replica holds all of it)."""
        return {"full": {n: v.copy() for u, f in zip(self.units, self.flats) for n, v in zip(u.names, u.views(f))}}

    def param_state(self) -> dict:
        return {"full": {n: v.copy() for u, f in zip(self.units, self.pflats) for n, v in zip(u.names, u.views(f))}}
