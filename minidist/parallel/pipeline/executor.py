"""Pipeline parallelism: stages of layers, activations and gradients between them, and one executor
that runs any schedule (chapter 16, lab 10).

Property: separability of ``f_L o ... o f_1``. Cut the blocks into ``p v`` contiguous pieces
(virtual stages); piece j lives on pipeline rank ``j % p`` as its chunk ``j // p``. A micro-batch's
forward crosses the pieces in order, its backward in reverse order, and because each piece only
needs its neighbour's activation (forward) or input gradient (backward), the ranks can work on
different micro-batches at once. The embeddings belong to the first piece, the final norm, head
and loss to the last. Each micro-batch's loss is scaled by its share of the global batch, so the
gradients summed over micro-batches are the full batch's.

Where the layers are cut is ``pipeline_stages.py``'s business (:func:`stage_layout`).
:class:`PipelineExecutor` runs a :class:`~minidist.parallel.pipeline.schedules.Schedule`'s action list on
this rank: sends are ``isend`` (waited for at the end of the step), receives block. Each compute
action is recorded as a ``pipeline`` event in the trace (name ``F3``, ``B3.1``, ...) for the Gantt
chart, and its activations are held on the memory ledger from the forward until the backward (for
``I``, until the ``W`` pass, minus what ``I`` let go). ``unit_costs`` replaces the roofline charge
of each action by fixed seconds per stage, the uniform-stage-cost world of the bubble formulas.

The model may be a tensor-parallel GPT (``tensor_parallelize``): the chunks then run their blocks'
collectives over the model's tp group, ``ranks`` is the pipeline of this rank's tp index, and with
sequence parallelism the activations and gradients between stages are (B, T/t, d) sequence shards.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager, nullcontext

import numpy as np

from minidist import dist
from minidist.autograd import Tensor
from minidist.autograd import cost as _cost
from minidist.autograd.engine import run_backward
from minidist.data import get_batch, load_tokens
from minidist.hardware.cluster import Cluster
from minidist.nn import GPT, GPTConfig
from minidist.parallel.memory import ActivationLedger, graph_bytes
from minidist.parallel.pipeline.chunk import Chunk
from minidist.parallel.pipeline.schedules import PLACEMENTS, Action, Schedule, rank_of, virtual_stage
from minidist.parallel.pipeline.split_backward import WeightGradStore
from minidist.parallel.pipeline.stages import stage_layout
from minidist.parallel.runner import Hooks
from minidist.runtime import launch
from minidist.runtime.context import current

TAG_BASE = 1 << 20  # pipeline messages' tags start here (kept apart from other point-to-point traffic)


@contextmanager
def _fixed_cost(clock, name: str, seconds: float):
    """Silence the autograd's roofline charges inside the block and charge ``seconds`` instead."""
    previous = _cost.set_cost_hook(None)
    try:
        yield
    finally:
        _cost.set_cost_hook(previous)
        clock.charge_compute_seconds(name, seconds)


class PipelineExecutor:
    """This rank's chunks of ``model`` and the machinery to run a schedule's actions on them.

    ``ranks``: the global ranks of the pipeline, stage order; ``stage``: this rank's index in it;
    ``layout``: block ranges of the ``p v`` virtual stages (see :func:`stage_layout`).
    ``unit_costs``: None (roofline charges from the autograd) or seconds per stage for ``F``, ``B``,
    ``I``, ``W`` (a chunk costs 1/v of them). ``ledger``: memory ledger for activations (optional).
    """

    def __init__(self, model, ranks: Sequence[int], stage: int, layout: Sequence[tuple[int, int]],
                 unit_costs: dict | None = None, ledger=None, recompute_every: int | None = None,
                 hooks: Hooks | None = None, recompute_layers: int | None = None, placement: str = "loop") -> None:
        p = len(ranks)
        if len(layout) % p:
            raise ValueError(f"PipelineExecutor: {len(layout)} virtual stages do not divide among {p} ranks")
        if model.config.dropout:
            raise ValueError(f"PipelineExecutor: dropout must be 0 (masks would differ from the single device), "
                             f"got {model.config.dropout}")
        self.model, self.ranks, self.stage, self.p = model, list(ranks), stage, p
        self.v = len(layout) // p
        self.nvs = len(layout)
        if placement not in PLACEMENTS or (placement == "v" and self.v != 2):
            raise ValueError(f"PipelineExecutor: placement must be one of {PLACEMENTS} ('v' with 2 chunks per rank), "
                             f"got {placement!r} with {self.v} chunks")
        self.placement = placement
        # the segments a recomputing chunk rebuilds in the backward are booked while they live
        self.acts = ActivationLedger(ledger) if ledger is not None else None
        self.hooks = hooks or Hooks()
        mine = [virtual_stage(placement, p, stage, c) for c in range(self.v)]
        self.chunks = [Chunk(model, *layout[vs], first=vs == 0, last=vs == self.nvs - 1,
                             recompute_every=recompute_every, acts=self.acts, hooks=self.hooks,
                             recompute_layers=recompute_layers)
                       for vs in mine]
        self.unit_costs, self.ledger = unit_costs, ledger
        tp = getattr(model, "tp", None)  # a tensor-parallel GPT: with sequence parallelism stages pass T/t shards
        self.seq_shards = tp.size if tp is not None and tp.sequence_parallel else 1
        self.store = WeightGradStore()
        self._wrapped = False
        self.select = None  # the batch share's micro-batch selector: an MoE layer's planned route reads it
        prefixes = [pre for ch in self.chunks for pre in ch.prefixes()]
        self.named = [(n, p_) for n, p_ in model.named_parameters() if any(n.startswith(pre) for pre in prefixes)]
        if model.config.tie_embeddings and any(ch.last for ch in self.chunks) and "wte." not in prefixes:
            # the last stage's head reads the embedding matrix: it keeps a copy, whose gradient the
            # engine sums with the first stage's (Megatron's embedding group)
            self.named.append(("wte.weight", model.wte.weight))

    def parameters(self) -> list:
        return [p for _, p in self.named]

    def use_hooks(self, hooks: Hooks, schedule: Schedule) -> None:
        """Let ``hooks`` (ZeRO-3/FSDP) see every unit of this stage start and end, with the action's phase."""
        self.hooks = hooks
        hooks.split_backward = any(a.op == "I" for acts in schedule.actions for a in acts)
        for ch in self.chunks:
            ch.hooks = hooks

    def _split(self) -> None:
        """Give this stage's Linears (dense or column-parallel) a splittable backward (once, before a schedule
        with I and W passes runs its first forward)."""
        if not self._wrapped:
            for ch in self.chunks:
                self.store.split(*[ch.model.blocks[i] for i in range(ch.lo, ch.hi)],
                                 *([ch.model.lm_head] if ch.last else []))
            self._wrapped = True

    # -- messages ------------------------------------------------------------------------------
    def _tag(self, kind: int, mb: int, vs: int) -> int:
        return TAG_BASE + 2 * (mb * self.nvs + vs) + kind

    def _neighbour(self, vs: int) -> tuple[int, int]:
        """Global ranks holding virtual stages vs - 1 and vs + 1 (wrapping round harmlessly at the ends)."""
        return (self.ranks[rank_of(self.placement, self.p, (vs - 1) % self.nvs)],
                self.ranks[rank_of(self.placement, self.p, (vs + 1) % self.nvs)])

    # -- one step ------------------------------------------------------------------------------
    def run(self, schedule: Schedule, idx: Sequence[np.ndarray], targets: Sequence[np.ndarray],
            weights: Sequence[float]) -> float:
        """Run this rank's actions of ``schedule`` on micro-batches ``idx[i]``/``targets[i]`` whose losses
        are scaled by ``weights[i]``; gradients accumulate into the parameters' ``.grad``. Returns the
        sum of the weighted losses computed here (non-zero on the last stage only)."""
        if schedule.stages != self.p or schedule.virtual != self.v or schedule.placement != self.placement:
            raise ValueError(f"PipelineExecutor.run: schedule is for p={schedule.stages}, v={schedule.virtual}, "
                             f"placement {schedule.placement!r}; this pipeline has p={self.p}, v={self.v}, placement "
                             f"{self.placement!r}")
        m = schedule.microbatches
        if not len(idx) == len(targets) == len(weights) == m:
            raise ValueError(f"PipelineExecutor.run: {m} micro-batches in the schedule but {len(idx)} inputs, "
                             f"{len(targets)} targets, {len(weights)} weights")
        clock = current("PipelineExecutor.run").clock
        d, dtype = self.model.config.d_model, np.dtype(self.model.config.dtype)
        like = next(iter(self.model.parameters())).data  # shape-only models receive shape-only activations
        inputs, outputs, recv, tokens, sends, routers = {}, {}, {}, {}, [], {}
        losses = 0.0
        if any(a.op == "I" for a in schedule.actions[self.stage]):
            # before the first forward: a micro-batch whose forward ran through a plain Linear would compute its
            # weight gradients inside its I pass, leaving its W empty and the bubble the W was meant to fill
            self._split()
        for a in schedule.actions[self.stage]:
            key = (a.mb, a.chunk)
            vs = virtual_stage(self.placement, self.p, self.stage, a.chunk)
            ch = self.chunks[a.chunk]
            prev_r, next_r = self._neighbour(vs)
            B, T = idx[a.mb].shape
            shape = (B, T // self.seq_shards, d)
            if a.op == "RECV_F":
                buf = np.empty(shape, dtype=dtype, like=like)
                dist.recv(buf, prev_r, tag=self._tag(0, a.mb, vs - 1))
                recv[("F",) + key] = buf
            elif a.op == "RECV_B":
                buf = np.empty(shape, dtype=dtype, like=like)
                dist.recv(buf, next_r, tag=self._tag(1, a.mb, vs + 1))
                recv[("B",) + key] = buf
            elif a.op == "SEND_F":
                sends.append(dist.isend(outputs[key].data, next_r, tag=self._tag(0, a.mb, vs)))
            elif a.op == "SEND_B":
                sends.append(dist.isend(inputs[key].grad, prev_r, tag=self._tag(1, a.mb, vs)))
            else:
                if self.select is not None and a.op != "W":  # a backward may recompute the micro-batch's forward
                    self.select(a.mb)
                start = clock.now()
                self.hooks.phase = "forward" if a.op == "F" else "backward"
                with self._charged(a, clock):
                    losses += self._compute(a, ch, vs, key, idx, targets, weights, inputs, outputs, recv, tokens,
                                            routers)
                clock.recorder.record("pipeline", str(a), start, clock.now(), 0.0, 0.0)
        for w in sends:
            w.wait()
        if self.ledger is not None:
            for n in tokens.values():  # nothing should be left; a schedule check makes sure
                self.ledger.free("activations", n)
        return losses

    def _compute(self, a: Action, ch: Chunk, vs, key, idx, targets, weights, inputs, outputs, recv, tokens,
                 routers) -> float:
        if a.op == "F":
            if ch.first:
                x = idx[a.mb]
            elif ("F",) + key in recv:
                x = Tensor(recv.pop(("F",) + key), requires_grad=True)
            else:  # the previous virtual stage is on this rank (p = 1)
                x = Tensor(outputs[(a.mb, a.chunk - 1)].data, requires_grad=True)
            inputs[key] = x
            out, router = ch.forward(x, targets[a.mb] if ch.last else None)
            loss = 0.0
            if ch.last:
                loss = float(out.data) * weights[a.mb]
                out = out * weights[a.mb]
            if router is not None:
                loss += float(router.data) * weights[a.mb]
                routers[key] = router * weights[a.mb]
            outputs[key] = out
            if self.ledger is not None:
                held = isinstance(x, Tensor)
                n = graph_bytes(out, exclude=[x] if held else []) + (x.data.nbytes if held else 0)
                self.ledger.alloc("activations", n)
                tokens[key] = n
            return loss
        if a.op in ("B", "I"):
            out = outputs.pop(key)
            if ch.last:
                grad = None
            elif ("B",) + key in recv:
                grad = recv.pop(("B",) + key)
            else:  # the next virtual stage is on this rank
                grad = inputs[(a.mb, a.chunk + 1)].grad
            roots, grads = ((out, routers.pop(key)), (grad, None)) if key in routers else ((out,), (grad,))
            if a.op == "I":
                self._split()
                with self.store.capture(key):
                    run_backward(roots, grads)
            else:
                run_backward(roots, grads)
            if self.ledger is not None:
                self.ledger.free("activations", tokens.pop(key))
                if a.op == "I":
                    n = self.store.stash_bytes(key)
                    self.ledger.alloc("activations", n)
                    tokens[key] = n
            return 0.0
        if a.op == "W":
            self.store.flush(key)
            if self.ledger is not None:
                self.ledger.free("activations", tokens.pop(key))
            return 0.0
        raise ValueError(f"PipelineExecutor: unknown action {a!r}")

    def _charged(self, a: Action, clock):
        """Roofline charges from the autograd, or (unit_costs) a fixed time with the autograd silent."""
        if self.unit_costs is None:
            return nullcontext()
        c = self.unit_costs
        return _fixed_cost(clock, str(a), (c["I"] + c["W"] if a.op == "B" and "B" not in c else c[a.op]) / self.v)

    def grads(self) -> dict[str, np.ndarray]:
        return {n: (np.zeros_like(p.data) if p.grad is None else p.grad.copy()) for n, p in self.named}

    def zero_grad(self) -> None:
        for _, p in self.named:
            p.grad = None


def measure_schedule(schedule: Schedule, config=None, unit_costs: dict | None = None, cluster=None,
                     rows: int = 1, seed: int = 0):
    """Execute one step of ``schedule`` on ``schedule.stages`` simulated ranks; returns the launch result.

    The model is ``config`` (default: a tiny float64 GPT with 8 blocks) cut evenly into the schedule's
    virtual stages; each micro-batch has ``rows`` sequences of the toy corpus. ``unit_costs`` (e.g.
    ``{"F": 1e-3, "I": 1e-3, "W": 1e-3}``) charges fixed seconds per action instead of the roofline,
    and ``cluster`` sets the links (default: free links, so only the schedule shapes the timeline).
    The result's ``trace`` has the ``pipeline`` events; ``memory[r].peak["activations"]`` the ledger.
    """
    cfg = config or GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=8, n_heads=2, dtype="float64")
    p, m, v = schedule.stages, schedule.microbatches, schedule.virtual
    layout = stage_layout(cfg.n_layers, p, v)
    tokens, _ = load_tokens(2_000, seed=0)
    x, y = get_batch(tokens, rows * m, cfg.seq_len, np.random.default_rng(seed))
    xs, ys = [x[i * rows:(i + 1) * rows] for i in range(m)], [y[i * rows:(i + 1) * rows] for i in range(m)]

    def rank():
        ex = PipelineExecutor(GPT(cfg, seed=seed), list(range(p)), dist.get_rank(), layout, unit_costs=unit_costs,
                              ledger=dist.memory(), placement=schedule.placement)
        return ex.run(schedule, xs, ys, [1 / m] * m)

    return launch(rank, world_size=p, cluster=cluster or Cluster.uniform(alpha=0.0, beta=float("inf")))
