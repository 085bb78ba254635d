"""ZeRO: shard the model state over the data-parallel group instead of replicating it (chapter 20, lab 13).

The property: the optimizer update is elementwise (see ``flat_optim``), so rank i only needs the
optimizer state, the summed gradient and the weights of *its* 1/p of the parameters; the other
ranks' updated weights arrive by an all-gather. Per rank, with s_w, s_g, s_o bytes per parameter
for weights, gradients and optimizer state (float64 AdamW: 8, 8, 16):

* stage 1 (optimizer state sharded): Psi (s_w + s_g) + Psi s_o / p       [mixed precision: 4 Psi + 12 Psi/p]
* stage 2 (+ gradients):            Psi s_w + Psi (s_g + s_o) / p        [2 Psi + 14 Psi/p]
* stage 3 (+ weights):              Psi (s_w + s_g + s_o) / p            [16 Psi/p]  -> ``fsdp.ShardedModel``

Communication: instead of one all-reduce, stages 1 and 2 reduce-scatter the gradients (each rank
receives the sum of its own slice) and all-gather the updated weights: a ring all-reduce *is* a
reduce-scatter followed by an all-gather, so the bytes are the same as data parallelism. Stage 1
keeps full gradients and reduce-scatters once per step (accumulation stays local); stage 2 keeps
only its gradient slice, so every micro-batch's buckets are reduce-scattered as they fill and
added into that slice. A bucket's gradients are held once, in full, while it fills and until it
is reduced: its transient flat buffer is allocated when its first gradient arrives, each ``.grad``
becomes a view of its slot there (as in data parallelism), and buffer and views are released once
the reduce-scatter is done (at most two buckets alive: one reducing, one filling). So stage 2
never holds a full gradient at the end of the forward, where activations peak; a bucket that holds
the whole model fills during the backward while the activations are freed, and stage 2 saves more
when buckets are smaller than the model, as in real runs (25 MB buckets, gigabytes of gradients).
"""

from __future__ import annotations

import numpy as np

from minidist import dist
from minidist.collectives import offered
from minidist.parallel.data.data_parallel import BucketedReducer
from minidist.parallel.data.flat import describe


class ZeroOptimizer(BucketedReducer):
    """ZeRO stage 1 or 2 over the buckets of :class:`BucketedReducer` (each padded to a multiple of p)."""

    def __init__(self, stage: int, *args, **kwargs) -> None:
        if stage not in (1, 2):
            raise ValueError(f"ZeroOptimizer: stage must be 1 or 2 (stage 3 is fsdp.ShardedModel), got {stage}")
        self.stage = stage
        self.ledger = None
        self._inflight: list[tuple] = []
        super().__init__(*args, **kwargs)
        self.grad_shards = ([np.zeros(u.shard_size, u.dtype, like=u.params[0].data) for u in self.units]
                            if stage == 2 else None)
        if stage == 2:  # no standing full-size gradient buckets: each allocated as it fills, freed once reduced
            self.flats = [None] * len(self.units)

    def _bucket(self, ui: int) -> np.ndarray:
        """Stage 2: bucket ``ui``'s transient buffer, allocated (and booked) when its first gradient arrives."""
        if self.stage == 1 or self.flats[ui] is not None:
            return self.flats[ui]
        self._drain(keep=1)  # at most two buckets alive: one reducing, one filling
        flat = self.flats[ui] = self.units[ui].empty()
        self.ledger.alloc("buffers", flat.nbytes)
        return flat

    @property
    def accumulates_locally(self) -> bool:
        return self.stage == 1

    def setup(self, ledger, state_bytes: dict) -> None:
        """Broadcast rank 0's weights and book the buffers this rank holds: full weights, and the full gradient
        buckets (stage 1) or the gradient shards (stage 2); the optimizer books its state when it creates it."""
        self.ledger = ledger
        self.broadcast_weights()
        ledger.alloc("params", sum(f.size for f in self.pflats) * state_bytes["params"])
        grads = self.flats if self.stage == 1 else self.grad_shards
        ledger.alloc("grads", sum(g.size for g in grads) * state_bytes["grads"])

    def collective(self, unit, flat: np.ndarray):
        if self.stage == 1:  # the full gradient buffer stays; this rank's slice receives the sum
            if self.dp == 1:
                return None
            return dist.reduce_scatter_tensor(unit.shard(flat), flat, group=self.group, async_op=True,
                                              algorithm=offered("reduce_scatter", self.algorithm))
        # stage 2: the bucket is a transient buffer; its reduced slice is added into the gradient shard. Its
        # parameters' .grad (views of it) are released: the bucket lives on only until it is reduced.
        ui = self.units.index(unit)
        for pi, p in enumerate(unit.params):
            p.grad = None
            self._slots.pop((ui, pi), None)
        self.flats[ui] = None
        out = np.empty(unit.shard_size, unit.dtype, like=flat)
        work = None
        if self.dp == 1:
            out[...] = flat
        else:
            work = dist.reduce_scatter_tensor(out, flat, group=self.group, async_op=True,
                                              algorithm=offered("reduce_scatter", self.algorithm))
        self._inflight.append((work, out, ui, flat))  # the bucket lives until it is reduced
        return None

    def _drain(self, keep: int = 0) -> None:
        while len(self._inflight) > keep:
            work, out, ui, flat = self._inflight.pop(0)
            if work is not None:
                work.wait()
            self.grad_shards[ui] += out
            self.ledger.free("buffers", flat.nbytes)

    def finish(self) -> None:
        super().finish()
        self._drain()
        if self.stage == 2:  # the micro-batch's gradients now live in the shards
            for u in self.units:
                for p in u.params:
                    p.grad = None

    def piece_names(self) -> list[list[str]]:
        """The parameter names behind each of :meth:`pieces` (a bucket's slice may cut through several)."""
        return [list(u.names) for u in self.units]

    def piece_layout(self) -> list[list[tuple[str, int, int, int]]]:
        """Per piece (this rank's slice of a bucket), which parameter elements it holds."""
        return [u.segments() for u in self.units]

    def pieces(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(weight slice, summed gradient slice) per bucket: the part of the model this rank updates."""
        if self.stage == 1:
            return [(u.shard(pf), u.shard(gf)) for u, pf, gf in zip(self.units, self.pflats, self.flats)]
        return [(u.shard(pf), g) for u, pf, g in zip(self.units, self.pflats, self.grad_shards)]

    def after_step(self, model) -> None:
        """Every rank updated its slice; an all-gather hands the new weights to everyone."""
        if self.dp > 1:
            for u, pf in zip(self.units, self.pflats):
                dist.all_gather_into_tensor(pf, u.shard(pf).copy(), group=self.group,
                                            algorithm=offered("all_gather", self.algorithm))
        if self.grad_shards is not None:
            for g in self.grad_shards:
                g[...] = 0
        model.zero_grad()

    def grad_state(self) -> dict:
        """This rank's slice of the summed gradient per bucket (``flat.assemble`` joins the ranks')."""
        if self.stage == 1:
            shards = {u.name: u.shard(g).copy() for u, g in zip(self.units, self.flats)}
        else:
            shards = {u.name: g.copy() for u, g in zip(self.units, self.grad_shards)}
        return {"shards": shards, "meta": [describe(u) for u in self.units]}

    def param_state(self) -> dict:
        return {"full": {n: v.copy() for u, f in zip(self.units, self.pflats) for n, v in zip(u.names, u.views(f))}}
