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

from contextlib import contextmanager

import numpy as np

from minidist import dist
from minidist.collectives import offered
from minidist.nn.moe import idle_expert_params, is_expert_param
from minidist.parallel.data.flat import FlatUnit, describe
from minidist.parallel.runner import Hooks


def plan_units(named: list, fsdp: bool, tied: bool = False) -> tuple[list[tuple[str, list]], dict[str, list[int]]]:
    """[(unit name, [(param name, param)])] in forward order, and runner key -> the units it uses.

    ``named`` may be part of a model (a pipeline stage's parameters): blocks, embeddings and head are
    units only where they are present. A tied embedding matrix is one weight used by the first and the
    last unit, so with ``tied`` it is a unit of its own kept from the forward until its gradients are
    done, as FSDP's root is (on a pipeline's last stage it is a copy, named ``tied.head``). Each expert
    of a block is a unit of its own (named ``block.i.expert.e``): it is sharded over its own replicas,
    and an expert no token reached is a whole unit the optimizer leaves alone.
    """
    def block(n: str) -> int:
        return int(n.split(".")[1])

    indices = sorted({block(n) for n, _ in named if n.startswith("blocks.")})
    blocks = []
    for i in indices:
        params = [(n, p) for n, p in named if n.startswith("blocks.") and block(n) == i]
        experts: dict[str, list] = {}
        for n, p in params:
            if is_expert_param(n):
                experts.setdefault(n.split(".experts.")[1].split(".")[0], []).append((n, p))
        blocks.append([(f"block.{i}", [(n, p) for n, p in params if not is_expert_param(n)])]
                      + [(f"block.{i}.expert.{e}", ps) for e, ps in experts.items()])
    shared = [(n, p) for n, p in named if tied and n == "wte.weight"]
    embed = [(n, p) for n, p in named if n.startswith(("wte.", "wpe.")) and not (shared and n == "wte.weight")]
    head = [(n, p) for n, p in named if not n.startswith(("wte.", "wpe.", "blocks.")) and n != "wte.weight"]
    # the tied matrix is a unit of its own, the same on the first and the last pipeline stage
    ends = [("tied" if embed else "tied.head", shared)] if shared else []
    if fsdp:
        ends += [("root", embed + head)] if embed or head else []
        units = ends + [u for b in blocks for u in b]
        keys = {k: list(range(len(ends))) for k, part in (("embed", embed), ("head", head)) if part}
    else:
        units = ends + ([("embed", embed)] if embed else []) + [u for b in blocks for u in b] + \
            ([("head", head)] if head else [])
        keys = {k: [i] + ([0] if shared else []) for k, i, part in
                (("embed", len(ends), embed), ("head", len(units) - 1, head)) if part}
    for ui, (name, _) in enumerate(units):
        if name.startswith("block."):
            keys.setdefault(".".join(name.split(".")[:2]), []).append(ui)
    return units, keys


class ShardedModel(Hooks):
    """Parameters kept as flat 1/p shards per unit, gathered around each use (ZeRO-3 / FSDP).

    ``group``: the ranks holding copies of the dense weights; ``expert_group``: those holding copies of
    this rank's experts (expert parallelism keeps different experts on different ranks)."""

    accumulates_locally = False

    def __init__(self, named: list, group, fsdp: bool = False, prefetch: int = 1, algorithm: str | None = None,
                 tied: bool = False, expert_group=None) -> None:
        """``named``: the ``(name, parameter)`` pairs this rank trains (a pipeline stage's, or the model's)."""
        self.algorithm, self.prefetch = algorithm, prefetch
        plan, self.keys = plan_units(named, fsdp, tied)
        self.kept = {"root", "tied", "tied.head"} if fsdp else {"tied", "tied.head"}
        blocks = sorted((k for k in self.keys if k.startswith("block.")), key=lambda k: int(k.split(".")[1]))
        self.order = [k for k in ["embed", *blocks, "head"] if k in self.keys]  # forward order
        me = dist.get_rank()
        self.groups = [expert_group if ".expert." in name else group for name, _ in plan]
        self.units = [FlatUnit(name, params, g.size(), g.group_rank(me))
                      for (name, params), g in zip(plan, self.groups)]
        self.full: list[np.ndarray | None] = [u.flatten([p.data for p in u.params]) for u in self.units]
        self.shards = [u.shard(f).copy() for u, f in zip(self.units, self.full)]
        for ui, u in enumerate(self.units):
            self._point(ui)
            for p in u.params:
                p.regathered = True  # the autograd reads it again at backward time instead of keeping it
        self.grad_shards = [np.zeros(u.shard_size, u.dtype, like=s) for u, s in zip(self.units, self.shards)]
        self.gathered = [True] * len(self.units)
        self._gathers: dict[int, object] = {}
        self._reductions: list[tuple] = []
        dense = [ui for ui, (name, _) in enumerate(plan) if ".expert." not in name]
        self._pending = {ui: len(self.units[ui].params) for ui in dense}
        # an expert's gradient exists only where tokens reached it: its unit is reduced, in a fixed order,
        # right after the dense unit of its block, whose last gradient comes after the experts' (layer norm)
        self._with = {ui: [uj for uj in self.keys.get(plan[ui][0], []) if ".expert." in plan[uj][0]] for ui in dense}
        self.host = None  # offload.HostParams when the weight shards live on the host
        self.split_backward = False  # zero-bubble pipelines: weight gradients arrive in later W passes
        self.ledger = None
        for ui in dense:
            for p in self.units[ui].params:
                p.register_post_accumulate_grad_hook(lambda _p, ui=ui: self._grad_ready(ui))

    def setup(self, ledger, state_bytes: dict) -> None:
        """Rank 0's initial weights reach every rank (each keeps its slice); book the sharded state."""
        self.ledger = ledger
        for ui, (u, f, g) in enumerate(zip(self.units, self.full, self.groups)):
            if u.world > 1:
                dist.broadcast(f, g.global_rank(0), group=g, algorithm=offered("broadcast", self.algorithm))
                self.shards[ui][...] = u.shard(f)
            self._drop(ui)
            self.gathered[ui] = False
        if self.host is None:  # the shards this rank holds; the optimizer books its state when it creates it
            ledger.alloc("params", sum(s.size for s in self.shards) * state_bytes["params"])
        ledger.alloc("grads", sum(g.size for g in self.grad_shards) * state_bytes["grads"])

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
        if u.world == 1:
            self.full[ui][...] = shard
        else:
            self._gathers[ui] = dist.all_gather_into_tensor(self.full[ui], shard, group=self.groups[ui], async_op=True,
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
                for ui in self.keys[self.order[j]]:
                    self._gather(ui)

    def _keeps(self, ui: int) -> bool:
        """FSDP's root unit (or the unit of tied embeddings) stays gathered between its forward and backward."""
        return self.units[ui].name in self.kept

    # -- the runner's hooks ----------------------------------------------------------------
    @contextmanager
    def no_sync(self):
        yield  # each unit's gradient is reduce-scattered as it completes: nothing accumulates in full

    def pre_forward(self, key: str) -> None:
        for ui in self.keys[key]:
            self._ensure(ui)
        if self.phase == "forward":
            self._prefetch(key, +1)

    def post_forward(self, key: str, out) -> None:
        for ui in self.keys[key]:
            if self.phase == "forward" and not self._keeps(ui):
                self._release(ui)
        if out.requires_grad:
            out.register_hook(lambda _g, key=key: self._pre_backward(key))

    def _pre_backward(self, key: str) -> None:
        for ui in self.keys[key]:
            self._ensure(ui)
        self._prefetch(key, -1)

    def post_backward(self, key: str) -> None:
        """Split backward: a unit's weights are free once its input gradient exists (W needs none)."""
        for ui in self.keys[key]:
            if self.split_backward and not self._keeps(ui):
                self._release(ui)

    def _grad_ready(self, ui: int) -> None:
        if self.split_backward:
            # I and W passes of different micro-batches interleave, so no count tells when a unit's
            # gradient of one micro-batch is complete: it accumulates whole and is reduced at finish()
            return
        self._pending[ui] -= 1
        if self._pending[ui]:
            return
        self._pending[ui] = len(self.units[ui].params)
        for uj in [ui, *self._with[ui]]:
            self._reduce(uj)

    def _reduce(self, ui: int) -> None:
        """Start reduce-scattering unit ``ui``'s gradient into its shard; its weights are no longer needed."""
        u = self.units[ui]
        like = self.shards[ui]
        flat = u.flatten([np.zeros(p.data.shape, u.dtype, like=like) if p.grad is None else p.grad for p in u.params])
        for p in u.params:
            p.grad = None
        self._release(ui)  # the unit's backward is over: nothing reads its weights until the next step
        self._drain(keep=1)  # at most two gradient buffers alive: one reducing, one being filled
        self.ledger.alloc("buffers", flat.nbytes)
        out = np.empty(u.shard_size, u.dtype, like=flat)
        work = None
        if u.world == 1:
            out[...] = flat
        else:
            work = dist.reduce_scatter_tensor(out, flat, group=self.groups[ui], async_op=True,
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
        if self.split_backward:
            for ui in range(len(self.units)):  # the same order on every rank of a group
                self._reduce(ui)
        self._drain()
        for ui in range(len(self.units)):
            self._release(ui)

    # -- optimizer -------------------------------------------------------------------------
    def pieces(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return list(zip(self.shards, self.grad_shards))

    def piece_names(self) -> list[list[str]]:
        return [list(u.names) for u in self.units]

    def piece_layout(self) -> list[list[tuple[str, int, int, int]]]:
        return [u.segments() for u in self.units]

    def skipped(self, model) -> frozenset[int]:
        """Indices into :meth:`pieces` of the experts no token reached: no gradient, so no update."""
        idle = idle_expert_params(model)
        return frozenset(ui for ui, u in enumerate(self.units) if idle and all(n in idle for n in u.names))

    def after_step(self, model) -> None:
        for g in self.grad_shards:
            g[...] = 0

    def grad_state(self) -> dict:
        return {"shards": {u.name: g.copy() for u, g in zip(self.units, self.grad_shards)},
                "meta": [describe(u) for u in self.units]}

    def param_state(self) -> dict:
        return {"shards": {u.name: s.copy() for u, s in zip(self.units, self.shards)},
                "meta": [describe(u) for u in self.units]}
