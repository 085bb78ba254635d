"""Sharded parameters: ZeRO stage 3 and FSDP (chapter 20, lab 13).

The property is the one of ZeRO (the update is elementwise, so each rank owns 1/p of every state
term), pushed to the weights themselves: between uses a layer exists only as 1/p shards, one per
rank. Just before a layer runs, forward or backward, an all-gather rebuilds its full weights in a
temporary buffer; right after, the buffer is released. The gradients of a layer are reduce-scattered
as soon as its backward is done, so each rank only ever accumulates its own slice. Per step each
layer's weights are gathered twice and its gradients reduce-scattered once: 3 (p-1)/p Psi s bytes,
1.5 times data parallelism, for model state of Psi (s_w + s_g + s_o) / p per rank.

Prefetch: while layer i computes, the all-gather of layer i+1 (forward) or i-1 (backward) is
already running on the comm stream, so the gathers hide behind compute when the layer is big
enough (lookahead ``prefetch`` layers).

Units: ``zero_stage=3`` shards the embeddings, every block and the head as separate units and
releases each right after use. ``fsdp=True`` wraps every block, and leaves the remaining weights
(embeddings, final norm, head) in a root unit that, like PyTorch's root FSDP module, stays gathered
from the start of the forward until its gradients are done: fewer gathers, a little more memory.

The sharding is real: between uses a unit's full buffer does not exist. Its parameters then point at
a read-only NaN of their shape (one element, broadcast), so the process holds only the shards, and
using weights that were not gathered shows at once.
"""

from __future__ import annotations

import numpy as np

from minidist import dist
from minidist.collectives import offered
from minidist.parallel.flat import FlatUnit, describe
from minidist.parallel.runner import Hooks


def plan_units(model, fsdp: bool) -> tuple[list[tuple[str, list]], dict[str, int]]:
    """[(unit name, [(param name, param)])] in forward order, and runner key -> unit index."""
    if model.config.tie_embeddings:
        raise ValueError("parallel.train: tie_embeddings=True is not supported with zero_stage=3 or fsdp "
                         "(the tied matrix would belong to two units)")
    named = list(model.named_parameters())
    blocks = [(f"block.{i}", [(n, p) for n, p in named if n.startswith(f"blocks.{i}.")])
              for i in range(len(model.blocks))]
    embed = [(n, p) for n, p in named if n.startswith(("wte.", "wpe."))]
    head = [(n, p) for n, p in named if not n.startswith(("wte.", "wpe.", "blocks."))]
    if fsdp:
        units = [("root", embed + head)] + blocks
        keys = {"embed": 0, "head": 0}
    else:
        units = [("embed", embed)] + blocks + [("head", head)]
        keys = {"embed": 0, "head": len(units) - 1}
    keys.update({name: i for i, (name, _) in enumerate(units) if name.startswith("block.")})
    return units, keys


class ShardedModel(Hooks):
    """Parameters kept as flat 1/p shards per unit, gathered around each use (ZeRO-3 / FSDP)."""

    accumulates_locally = False

    def __init__(self, model, group, dp: int, dp_rank: int, fsdp: bool = False, prefetch: int = 1,
                 algorithm: str | None = None) -> None:
        self.group, self.dp, self.algorithm, self.prefetch, self.fsdp = group, dp, algorithm, prefetch, fsdp
        plan, self.keys = plan_units(model, fsdp)
        self.order = ["embed"] + [f"block.{i}" for i in range(len(model.blocks))] + ["head"]  # forward order
        self.units = [FlatUnit(name, params, dp, dp_rank) for name, params in plan]
        self.full: list[np.ndarray | None] = [u.flatten([p.data for p in u.params]) for u in self.units]
        self.shards = [u.shard(f).copy() for u, f in zip(self.units, self.full)]
        for ui, u in enumerate(self.units):
            self._point(ui)
            for p in u.params:
                p.regathered = True  # the autograd reads it again at backward time instead of keeping it
        self.grad_shards = [np.zeros(u.shard_size, u.dtype) for u in self.units]
        self.gathered = [True] * len(self.units)
        self._gathers: dict[int, object] = {}
        self._reductions: list[tuple] = []
        self._pending = [len(u.params) for u in self.units]
        self.host = None  # offload.HostParams when the weight shards live on the host
        self.ledger = None
        for ui, u in enumerate(self.units):
            for p in u.params:
                p.register_post_accumulate_grad_hook(lambda _p, ui=ui: self._grad_ready(ui))

    def setup(self, ledger, state_bytes: dict) -> None:
        """Rank 0's initial weights reach every rank (each keeps its slice); book the sharded state."""
        self.ledger = ledger
        for ui, (u, f) in enumerate(zip(self.units, self.full)):
            if self.dp > 1:
                dist.broadcast(f, self.group.global_rank(0), group=self.group,
                               algorithm=offered("broadcast", self.algorithm))
                self.shards[ui][...] = u.shard(f)
            self._drop(ui)
            self.gathered[ui] = False
        shard = sum(u.shard_size for u in self.units)
        if self.host is None:
            ledger.alloc("params", shard * state_bytes["params"])
        ledger.alloc("grads", shard * state_bytes["grads"])
        ledger.alloc("optimizer", shard * state_bytes["optimizer"])

    # -- gathering -------------------------------------------------------------------------
    def _point(self, ui: int) -> None:
        """Unit ``ui``'s parameters become views of its full buffer."""
        for p, v in zip(self.units[ui].params, self.units[ui].views(self.full[ui])):
            p.data = v

    def _drop(self, ui: int) -> None:
        """Free unit ``ui``'s full buffer; its parameters read NaN (one element) until the next gather."""
        self.full[ui] = None
        for p in self.units[ui].params:
            p.data = np.broadcast_to(np.array(np.nan, dtype=self.units[ui].dtype), p.data.shape)

    def _gather(self, ui: int) -> None:
        """Start rebuilding unit ``ui``'s full weights (async); no-op if they are there or coming."""
        if self.gathered[ui]:
            return
        u = self.units[ui]
        self.ledger.alloc("buffers", u.padded * u.itemsize)
        self.full[ui] = u.empty()
        self._point(ui)
        shard = self.shards[ui] if self.host is None else self.host.fetch(ui)
        if self.dp == 1:
            self.full[ui][...] = shard
        else:
            self._gathers[ui] = dist.all_gather_into_tensor(self.full[ui], shard, group=self.group, async_op=True,
                                                            algorithm=offered("all_gather", self.algorithm))
        self.gathered[ui] = True

    def _ensure(self, ui: int) -> None:
        self._gather(ui)
        work = self._gathers.pop(ui, None)
        if work is not None:
            work.wait()
        if self.host is not None:
            self.host.wait(ui)

    def _release(self, ui: int) -> None:
        if self.gathered[ui]:
            self._ensure(ui)  # never drop a gather still in flight
            self._drop(ui)
            u = self.units[ui]
            self.ledger.free("buffers", u.padded * u.itemsize)
            self.gathered[ui] = False

    def _prefetch(self, key: str, step: int) -> None:
        """Start gathering the next ``prefetch`` units in forward (step +1) or backward (-1) order."""
        pos = self.order.index(key)
        for j in range(pos + step, pos + step * (self.prefetch + 1), step):
            if 0 <= j < len(self.order):
                self._gather(self.keys[self.order[j]])

    def _keeps(self, ui: int) -> bool:
        """FSDP's root unit stays gathered between its forward and its backward."""
        return self.fsdp and self.units[ui].name == "root"

    # -- the runner's hooks ----------------------------------------------------------------
    def pre_forward(self, key: str) -> None:
        ui = self.keys[key]
        self._ensure(ui)
        if self.phase == "forward":
            self._prefetch(key, +1)

    def post_forward(self, key: str, out) -> None:
        ui = self.keys[key]
        if self.phase == "forward" and not self._keeps(ui):
            self._release(ui)
        if out.requires_grad:
            out.register_hook(lambda _g, key=key: self._pre_backward(key))

    def _pre_backward(self, key: str) -> None:
        self._ensure(self.keys[key])
        self._prefetch(key, -1)

    def _grad_ready(self, ui: int) -> None:
        self._pending[ui] -= 1
        if self._pending[ui]:
            return
        self._pending[ui] = len(self.units[ui].params)
        u = self.units[ui]
        flat = u.flatten([p.grad for p in u.params])
        for p in u.params:
            p.grad = None
        self._release(ui)  # the unit's backward is over: nothing reads its weights until the next step
        self._drain(keep=1)  # at most two gradient buffers alive: one reducing, one being filled
        self.ledger.alloc("buffers", flat.nbytes)
        out = np.empty(u.shard_size, u.dtype)
        work = None
        if self.dp == 1:
            out[...] = flat
        else:
            work = dist.reduce_scatter_tensor(out, flat, group=self.group, async_op=True,
                                              algorithm=offered("reduce_scatter", self.algorithm))
        self._reductions.append((work, out, ui, flat.nbytes))

    def _drain(self, keep: int = 0) -> None:
        """Wait for all but the last ``keep`` reductions and add them into the gradient shards."""
        while len(self._reductions) > keep:
            work, out, ui, nbytes = self._reductions.pop(0)
            if work is not None:
                work.wait()
            self.grad_shards[ui] += out
            self.ledger.free("buffers", nbytes)

    def finish(self) -> None:
        """After a micro-batch's backward: wait for the reductions, add them into the gradient shards."""
        self._drain()
        for ui in range(len(self.units)):
            self._release(ui)

    # -- optimizer -------------------------------------------------------------------------
    def pieces(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return list(zip(self.shards, self.grad_shards))

    def after_step(self, model) -> None:
        for g in self.grad_shards:
            g[...] = 0

    def grad_state(self) -> dict:
        return {"shards": {u.name: g.copy() for u, g in zip(self.units, self.grad_shards)},
                "meta": [describe(u) for u in self.units]}

    def param_state(self) -> dict:
        return {"shards": {u.name: s.copy() for u, s in zip(self.units, self.shards)},
                "meta": [describe(u) for u in self.units]}
