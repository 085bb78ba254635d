"""Context and expert parallelism inside ``md.parallel.train`` (issue 9; labs 11, 12, 16).

Both axes split the *tokens* of a step, like data parallelism: ``ep`` ranks take different
sequences, ``cp`` ranks different positions of the same sequences. So the ranks that differ only in
dp, ep and cp form one **data group**: every weight replicated over it has its gradient summed over
it, and every loss is scaled by the rank's share of the global batch (its rows over the global
batch, and 1/cp for its positions). Two exceptions:

* an expert's weights live only on the ranks with the same ep coordinate; their gradients are
  summed over those ranks (dp x cp), the **expert group**;
* MoE routing counts are all-gathered over the whole data group, so capacity drops and the
  load-balancing loss are those of the global batch, exactly as on one device.

Both reducers of an MoE model launch their all-reduces when the backward is over, in a fixed
order: an expert that received no token produces no gradient on one rank and one on another, and
hook-driven launches would then run the same group's collectives in different orders. (The
dense parameters of models without experts keep DDP's overlapped buckets.)

:class:`TokenPlan` is what the trainer asks: the data group, which rows and positions this rank
takes, the loss share, and the gradient reducer.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from minidist.nn.moe import idle_expert_params
from minidist.parallel.context_parallel import LAYOUTS, METHODS, CPGroup, context_parallelize
from minidist.parallel.data_parallel import DataParallel, make_buckets
from minidist.parallel.expert_parallel import EPGroup, expert_parallelize, is_expert_param
from minidist.parallel.mesh import BATCH, DENSE_GRAD, EXPERT_GRAD
from minidist.parallel.zero import ZeroOptimizer


def check_layout(cfg, pc) -> None:
    """Refuse layouts this integration does not support, before any rank starts."""
    if pc.cp_method not in METHODS:
        raise ValueError(f"parallel.train: cp_method must be one of {METHODS}, got {pc.cp_method!r}")
    if pc.cp_layout not in LAYOUTS:
        raise ValueError(f"parallel.train: cp_layout must be one of {LAYOUTS}, got {pc.cp_layout!r}")
    if (pc.ep > 1 or cfg.n_experts) and (pc.tp > 1 or pc.sequence_parallel):
        raise ValueError("parallel.train: ep and mixture-of-experts models do not compose with tp or "
                         f"sequence_parallel yet (tp does not split experts); got ep={pc.ep}, "
                         f"n_experts={cfg.n_experts}, tp={pc.tp}")
    if pc.cp > 1 and pc.sequence_parallel:
        raise ValueError("parallel.train: cp with sequence_parallel is not built yet (both would cut the "
                         "sequence and the positions); use tp without sequence_parallel with cp")
    if (pc.ep > 1 or cfg.n_experts) and pc.pp > 1:
        raise ValueError("parallel.train: ep and mixture-of-experts models do not compose with pp yet; "
                         f"got ep={pc.ep}, n_experts={cfg.n_experts}, pp={pc.pp}")
    if pc.cp > 1:
        pieces = pc.cp * (2 if pc.cp_layout == "zigzag" else 1)
        if cfg.seq_len % pieces:
            raise ValueError(f"parallel.train: seq_len={cfg.seq_len} must split into {pieces} equal chunks "
                             f"(cp={pc.cp}, cp_layout={pc.cp_layout!r})")
        if pc.cp_method == "ulysses" and (cfg.n_heads // pc.tp) % pc.cp:
            raise ValueError(f"parallel.train: Ulysses deals each rank's {cfg.n_heads // pc.tp} query heads "
                             f"(n_heads={cfg.n_heads} / tp={pc.tp}) out over cp={pc.cp}: they must divide evenly")
    if pc.ep > 1:
        if not cfg.n_experts:
            raise ValueError(f"parallel.train: ep={pc.ep} needs a mixture-of-experts model (GPTConfig(n_experts=...))")
        if cfg.n_experts % pc.ep:
            raise ValueError(f"parallel.train: {cfg.n_experts} experts cannot be split evenly over ep={pc.ep}")
    if cfg.n_experts and pc.cp > 1 and cfg.capacity_factor is not None:
        # capacity serves a rank's tokens before the next rank's; cp ranks hold interleaved pieces of
        # the same sequences, so the dropped set would differ from one device's
        raise ValueError("parallel.train: capacity dropping with cp > 1 would depend on the layout; "
                         "use capacity_factor=None with context parallelism")
    if cfg.n_experts and pc.microbatches > 1:
        raise ValueError("parallel.train: a mixture-of-experts model trains with microbatches=1: expert capacity and "
                         "the load-balancing loss are statistics of the whole batch, and accumulating micro-batches "
                         "would compute them per micro-batch, a different objective "
                         f"(got microbatches={pc.microbatches})")
    if cfg.n_experts and pc.shards_params:
        raise ValueError("parallel.train: mixture-of-experts models train with zero_stage 0, 1 or 2 for now "
                         "(ZeRO-3 and FSDP, which gather a block's weights over one group, are not built for "
                         f"experts that live on one ep rank); got zero_stage={pc.zero_stage}, fsdp={pc.fsdp}")


class TokenPlan:
    """How this rank takes part in a step when tokens are split over dp x ep x cp (see the module docstring)."""

    def __init__(self, model, mesh, pc) -> None:
        self.pc = pc
        self.group = mesh.get_group(DENSE_GRAD)
        self.size, self.index = self.group.size(), self.group.group_rank(mesh.rank)
        self.batch_parts, self.batch_index = mesh.size(BATCH), mesh.get_local_rank(BATCH)
        self.loss_share = 1.0 / pc.cp
        self.cp = None
        if pc.cp > 1:
            self.cp = CPGroup.of(mesh.get_group("cp"), pc.cp_layout, pc.algorithm)
            context_parallelize(model, self.cp, pc.cp_method)
        self.has_experts = bool(model.config.n_experts)
        if self.has_experts:
            ep = EPGroup.of(mesh.get_group("ep"), self.group if self.size > 1 else None, pc.algorithm)
            expert_parallelize(model, ep)
            self.expert_group = mesh.get_group(EXPERT_GRAD)
            self.expert_size, self.expert_index = self.expert_group.size(), self.expert_group.group_rank(mesh.rank)

    def shard(self, x: np.ndarray) -> np.ndarray:
        """This rank's positions of a (rows, T) batch."""
        return x if self.cp is None else self.cp.shard(x)

    def reducer(self, named: list, bucket_bytes: float, zero_stage: int = 0):
        """The gradient reducer of an MoE model: dense weights over the data group, experts over theirs."""
        return ExpertDataParallel(named, bucket_bytes, self, self.pc.algorithm, zero_stage)


def expert_buckets(named: list, bucket_bytes: float) -> list[list]:
    """Buckets that never mix two experts, so an expert no token reached is whole pieces to skip."""
    by_expert: dict[str, list] = {}
    for n, p in named:
        by_expert.setdefault(n[:n.index(".experts.") + len(".experts.")] + n.split(".experts.")[1].split(".")[0],
                             []).append((n, p))
    return [b for group in reversed(list(by_expert.values())) for b in make_buckets(group, bucket_bytes)]


class ExpertDataParallel:
    """Data parallelism with two reducers, dense weights over the data group and experts over the expert
    group, both launched at the end of the backward in a fixed order; plain DDP or ZeRO-1/2 in each.
    The same interface as :class:`DataParallel`."""

    accumulates_locally = True

    def __init__(self, named: list, bucket_bytes: float, plan: TokenPlan, algorithm: str | None,
                 zero_stage: int = 0) -> None:
        dense = [(n, p) for n, p in named if not is_expert_param(n)]
        experts = [(n, p) for n, p in named if is_expert_param(n)]

        def reducer(params, group, size, index, **kw):
            if zero_stage:
                return ZeroOptimizer(zero_stage, params, bucket_bytes, group, size, index, algorithm, **kw)
            return DataParallel(params, bucket_bytes, group, size, index, algorithm, **kw)

        self.parts = [reducer(dense, plan.group, plan.size, plan.index)]
        if experts:
            self.parts.append(reducer(experts, plan.expert_group, plan.expert_size, plan.expert_index,
                                      buckets=expert_buckets(experts, bucket_bytes), name="expert_bucket"))
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

    def skipped(self, model) -> frozenset[int]:
        """Indices into :meth:`pieces` of the experts no token reached: no gradient, so no update."""
        idle = idle_expert_params(model)
        names = [piece for part in self.parts for piece in part.piece_names()]
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
