"""``parallelize(model, mesh, config)``: every parallelism is a transformation of one model, applied in one place.

torchtitan's ``parallelize_fn`` in our size. Each strategy rests on its own property, acts on its own
mesh axis and leaves a seam for the next, so they compose when applied in this order:

1. **pipeline** (pp, separability): cut the layers into stages first; everything below acts on a stage.
2. **tensor and sequence parallelism** (tp, linearity): split each block's matrices into column and row
   blocks; the attention keeps a replaceable core between its projections.
3. **context parallelism** (cp, the associative online softmax): the attention core attends across the
   cp ranks, each holding a share of every sequence's positions.
4. **expert parallelism** (ep, sparsity): each MoE layer keeps its experts and routes tokens by all-to-all.
5. **recomputation** (determinism): selective wraps whichever attention core 2-4 installed; full or every
   k layers checkpoints block segments.
6. **data parallelism** (associativity) per gradient group: DDP, ZeRO-1/2 or ZeRO-3/FSDP over the ranks
   holding copies of a weight: the dense group (dp, ep, cp) and, for experts, the expert group (dp, cp).
7. **offloading**: the optimizer state (and with ZeRO-3 the weights) move to the host tier.

The result is what the one rank loop of ``md.parallel.train`` trains: an engine that runs a step's
micro-batches, the reducer that holds the gradients, and this rank's share of every batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minidist import dist
from minidist.parallel.config import ParallelConfig
from minidist.parallel.context.context_parallel import CPGroup, context_parallelize
from minidist.parallel.data.compression import CompressedDataParallel
from minidist.parallel.data.data_parallel import DataParallel, make_buckets
from minidist.parallel.data.flat_optim import FlatOptimizer
from minidist.parallel.data.fsdp import ShardedModel
from minidist.parallel.data.zero import ZeroOptimizer
from minidist.parallel.engine import MicroBatches, PipelineEngine
from minidist.parallel.expert.expert_data_parallel import ExpertDataParallel
from minidist.parallel.expert.expert_parallel import EPGroup, expert_parallelize
from minidist.parallel.memory import ActivationLedger
from minidist.parallel.mesh import BATCH, DENSE_GRAD, EXPERT_GRAD, pipeline_ends
from minidist.parallel.offload import HostOptimizer, HostParams, HostTier
from minidist.parallel.pipeline.executor import PipelineExecutor
from minidist.parallel.pipeline.stages import stage_layout
from minidist.parallel.recompute import selective_core
from minidist.parallel.refusals import build_schedule
from minidist.parallel.runner import Runner
from minidist.parallel.tensor.tensor_parallel import TPGroup
from minidist.parallel.tensor.tensor_parallel_model import shard_axes, tensor_parallelize
from minidist.runtime.context import current
from minidist.runtime.mesh import DeviceMesh


def split_sizes(n: int, parts: int) -> list[int]:
    """``n`` items in ``parts`` nearly equal consecutive parts (the first ``n % parts`` get one more)."""
    base, extra = divmod(n, parts)
    return [base + (i < extra) for i in range(parts)]


@dataclass
class BatchShare:
    """Which part of every global batch one rank computes on: rows ``index`` of ``parts`` (dp x ep split the
    sequences), then its positions when cp > 1, cut into micro-batches. Each micro-batch's loss weight
    is its share of the global batch, so the summed gradient is that of the global mean loss.

    ``by_microbatch`` (MoE models): the batch is cut into ``microbatches`` global micro-batches first and each is
    dealt over the parts, so global micro-batch j is the same set of sequences in every layout, one device's
    micro-batch j; an MoE layer's routing statistics are those of the micro-batch it sees. Dense models keep the
    rows first (the same gradient either way). The index of every token held in its global micro-batch
    (``token_index``, for the micro-batch ``select`` names) is where an MoE layer's planned route is read, so a token
    is routed as on one device whatever the layout."""

    parts: int
    index: int
    microbatches: int
    cp: CPGroup | None = None
    by_microbatch: bool = False
    held: list | None = field(default=None, init=False, repr=False)  # per micro-batch: (token indices, tokens)
    current: int = field(default=0, init=False, repr=False)

    def split(self, x: np.ndarray, y: np.ndarray) -> tuple[list, list, list[float]]:
        """This rank's micro-batches of a global batch ``(x, y)``: inputs, targets and loss weights."""
        total, T = x.shape[0], x.shape[1]
        cuts = []  # (first row, end row, first row of its global micro-batch, rows of that micro-batch)
        if self.by_microbatch:
            bounds = np.cumsum([0] + split_sizes(total, self.microbatches))
            for a, b in zip(bounds, bounds[1:]):
                rows = split_sizes(int(b - a), self.parts)
                lo = int(a) + sum(rows[:self.index])
                cuts.append((lo, lo + rows[self.index], int(a), int(b - a)))
        else:
            rows = split_sizes(total, self.parts)
            lo = sum(rows[:self.index])
            bounds = lo + np.cumsum([0] + split_sizes(rows[self.index], self.microbatches))
            cuts = [(int(a), int(b), 0, total) for a, b in zip(bounds, bounds[1:])]
        positions = np.arange(T) if self.cp is None else self.cp.positions(T)
        self.held = [((((a - base) + np.arange(b - a))[:, None] * T + positions).reshape(-1), size * T)
                     for a, b, base, size in cuts]
        self.current = 0
        share = 1.0 if self.cp is None else 1.0 / self.cp.size
        shard = (lambda v: v) if self.cp is None else self.cp.shard
        return ([shard(x[a:b]) for a, b, _, _ in cuts], [shard(y[a:b]) for a, b, _, _ in cuts],
                [np.float64((b - a) / total * share) for a, b, _, _ in cuts])  # numpy scalars, as the estimator assumes

    def select(self, microbatch: int) -> None:
        """The micro-batch (of the last ``split``) whose forward runs next (the engines call it)."""
        self.current = microbatch

    def token_index(self, tokens: int) -> tuple[np.ndarray, int]:
        """(index ``sequence x seq_len + position`` in its global micro-batch of each token of the selected
        micro-batch, in this rank's (sequence, position) order; tokens in that global micro-batch)."""
        held = self.held[self.current] if self.held else None
        if held is None or tokens != held[0].size:
            raise ValueError(f"MoE planned routing: a layer on batch share {self.index} of {self.parts} saw {tokens} "
                             f"tokens, but its micro-batch {self.current} holds {0 if held is None else held[0].size}; "
                             "a planned route is read from the selected micro-batch of the last split")
        return held


@dataclass
class Parallelized:
    """What ``parallelize`` returns: the transformed model and what the rank loop needs to train it."""

    model: object
    reducer: object
    engine: object
    batch: BatchShare
    host: HostOptimizer | None = None
    acts: ActivationLedger | None = None
    tp_axes: dict | None = None
    report: dict = field(default_factory=dict)  # what the trainer passes on (pipeline stage and layout)


def parallelize(model, mesh: DeviceMesh, config: ParallelConfig, optimizer: FlatOptimizer, state_bytes: dict,
                layer_costs: list[float] | None = None) -> Parallelized:
    """Apply ``config``'s parallelisms to ``model`` (a GPT built from the same seed on every rank) on ``mesh``.

    Call inside ``md.launch``. ``optimizer`` is what the rank loop steps (offloading moves it to the
    host); ``state_bytes`` the bytes per parameter to book on the memory ledger; ``layer_costs`` the
    measured cost of each block, for ``pp_balance="measured"``.
    """
    pc, ledger = config, dist.memory()
    executor = schedule = None
    if pc.pp > 1:  # 1. stages first: everything below transforms the model, the executor runs this rank's stage
        schedule = build_schedule(pc, model.config.n_layers)
        layout = stage_layout(model.config.n_layers, pc.pp, schedule.virtual, layer_costs)
    tp_axes = None
    if pc.tp > 1 or pc.sequence_parallel:  # 2.
        tpg = TPGroup(mesh.get_group("tp"), pc.tp, mesh.get_local_rank("tp"), pc.sequence_parallel, pc.algorithm,
                      pc.tp_overlap)
        model = tensor_parallelize(model, tpg)
        tp_axes = shard_axes(model)
    cp = None
    if pc.cp > 1:  # 3.
        cp = CPGroup.of(mesh.get_group("cp"), pc.cp_layout, pc.algorithm)
        context_parallelize(model, cp, pc.cp_method)
    dense_group = mesh.get_group(DENSE_GRAD)
    batch = BatchShare(mesh.size(BATCH), mesh.get_local_rank(BATCH), pc.microbatches, cp, bool(model.config.n_experts))
    if model.config.n_experts:  # 4. (ep = 1 too: the routing counts of the whole micro-batch, over the data group)
        expert_parallelize(model, EPGroup.of(mesh.get_group("ep"), dense_group if dense_group.size() > 1 else None,
                                             pc.algorithm), placement=batch)
    if pc.pp > 1:
        executor = PipelineExecutor(model, list(mesh.get_group("pp").ranks), mesh.get_local_rank("pp"), layout,
                                    ledger=ledger, recompute_every=pc.recompute_every,
                                    recompute_layers=pc.recompute_layers, placement=schedule.placement)
        executor.select = batch.select
    acts = executor.acts if executor is not None else ActivationLedger(ledger)
    if pc.recompute == "selective":  # 5. (segments are checkpointed by the runner or the pipeline's chunks)
        for block in model.blocks:
            block.attn.core = selective_core(block.attn.core, acts)
    named = executor.named if executor is not None else list(model.named_parameters())
    reducer = _data_parallel(model, named, mesh, pc)  # 6.
    if executor is not None and pc.shards_params:
        executor.use_hooks(reducer, schedule)
    host = None
    if pc.offload:  # 7.
        clock = current("md.parallel.parallelize").clock
        tier = HostTier(clock, dist.cluster(), dist.get_rank(), dist.get_world_size())
        if pc.offload == "optimizer+params":
            reducer.host = HostParams(reducer.shards, tier, clock)
        host = HostOptimizer(optimizer, clock, tier, state_bytes, params_on_host=pc.offload == "optimizer+params")
    reducer.setup(ledger, dict(state_bytes, optimizer=0) if host else state_bytes)
    if host is not None:
        host.setup(reducer.pieces())
    else:  # the optimizer state is allocated with the model state, and booked from its arrays
        optimizer.allocate(reducer.pieces(), ledger, state_bytes["optimizer"])
    if executor is not None:
        # tied embeddings: the first and last stages both use the matrix; on the V placement both are rank 0's
        ends = pipeline_ends(mesh) if model.config.tie_embeddings and schedule.placement == "loop" else None
        engine = PipelineEngine(executor, schedule, reducer, ends, pc.algorithm)
        return Parallelized(model, reducer, engine, batch, host, acts, tp_axes,
                            {"layout": layout, "stage": mesh.get_local_rank("pp")})
    runner = Runner(model, pc, acts, reducer if pc.shards_params else None)
    return Parallelized(model, reducer, MicroBatches(runner, reducer, batch.select), batch, host, acts, tp_axes)


def _data_parallel(model, named: list, mesh: DeviceMesh, pc: ParallelConfig):
    """The data-parallel flavour of ``pc`` over the gradient groups of ``mesh``."""
    group = mesh.get_group(DENSE_GRAD)
    size, index = group.size(), group.group_rank(mesh.rank)
    alone = ("wte.weight",) if model.config.tie_embeddings and pc.pp > 1 else ()  # summed across two stages
    if pc.shards_params:
        experts = mesh.get_group(EXPERT_GRAD) if model.config.n_experts else None
        return ShardedModel(named, group, fsdp=pc.fsdp, prefetch=pc.prefetch, algorithm=pc.algorithm,
                            tied=model.config.tie_embeddings, expert_group=experts)
    if pc.compression is not None:
        return CompressedDataParallel(pc.compression, named, pc.bucket_bytes, group, size, index, pc.algorithm)
    if model.config.n_experts:
        return ExpertDataParallel(named, pc.bucket_bytes, group, mesh.get_group(EXPERT_GRAD), pc.algorithm,
                                  pc.zero_stage, alone)
    if pc.zero_stage in (1, 2):
        return ZeroOptimizer(pc.zero_stage, named, pc.bucket_bytes, group, size, index, pc.algorithm,
                             buckets=make_buckets(named, pc.bucket_bytes, alone))
    return DataParallel(named, pc.bucket_bytes, group, size, index, pc.algorithm)
