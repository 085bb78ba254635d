"""Predict a run of ``md.parallel.train`` before it runs: step time and memory of a layout, term by term
(book ch6, ch27; lab 18).

Property: the simulator charges every op by the roofline and every message by alpha-beta, so a step's
time is a sum of closed forms once the ops (``gpt_ops``), the collectives each strategy adds and the
order they run in are known. This model walks one rank's step in that order with two streams, as the
simulated clock does: compute ops and synchronous collectives (tensor parallelism, the ZeRO
all-gathers) advance the program, and a synchronous collective also waits for the communication stream;
the data-parallel buckets run on the communication stream as the backward releases them. Predicting
the simulator is how the estimator of ``perf.py`` is checked against something that runs: the same
constants, the same cluster, no fitted efficiency.

Covered here: any ``dp`` and ``tp`` (Megatron's layout, no sequence parallelism), gradient accumulation,
ZeRO stages 0-3, pipelines, context parallelism and recomputation, on GPTs with GELU or SwiGLU MLPs,
layer or RMS norm, with or without biases, multi-head or grouped-query attention (not with context
parallelism) and untied embeddings; and mixtures of experts over ``dp`` and ``ep`` (``moe_ops.py``: exact when
every token goes to every expert, the balanced case otherwise). Other layouts raise ValueError naming
what is not modelled yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minidist.estimate._check import choice, count
from minidist.estimate.comm import collective_time, hierarchical_all_reduce_time
from minidist.estimate.gpt_ops import (
    Op,
    Shard,
    activation_bytes,
    block_backward,
    block_forward,
    embed_backward,
    embed_forward,
    head_backward,
    head_forward,
    optimizer_bytes,
)
from minidist.estimate.moe_ops import (
    moe_block_activation_bytes,
    moe_block_backward,
    moe_block_forward,
    moe_head_backward,
    moe_head_forward,
    moe_parameters,
)
from minidist.estimate.pipeline import stage_orders
from minidist.estimate.sharded_step import sharded_step
from minidist.estimate.streams import Streams as _Streams
from minidist.hardware.cluster import Cluster
from minidist.hardware.kernels import peak_format

AXES = ("pp", "dp", "ep", "cp", "tp")  # the mesh's order, tp fastest (md.parallel.build_mesh)
MOMENTS = {"adamw": 2, "sgd": 1}


@dataclass
class Prediction:
    """A layout's predicted step: ``step_time`` (s, the slowest rank), its ``terms`` (compute, each axis's
    exposed communication, the optimizer), and ``memory`` (bytes by ledger category at the peak, and
    ``total``)."""

    step_time: float
    terms: dict[str, float] = field(default_factory=dict)
    memory: dict[str, float] = field(default_factory=dict)


def _groups(parallel, cluster: Cluster) -> dict[str, tuple[int, list[int]]]:
    """Per axis (and the flattened data-parallel group): its size and how many of its ranks share each node,
    for the group that holds rank 0 (every group of an axis has the same shape)."""
    shape = [getattr(parallel, a) for a in AXES]
    ranks = np.arange(int(np.prod(shape))).reshape(shape)
    out = {}
    for name, axes in {**{a: (a,) for a in AXES}, "grad": ("dp", "ep", "cp"), "expert": ("dp", "cp")}.items():
        sel = tuple(slice(None) if a in axes else 0 for a in AXES)
        members = ranks[sel].reshape(-1)
        nodes = np.bincount(members // cluster.gpus_per_node)
        out[name] = (len(members), [int(c) for c in nodes if c])
    return out


def runtime_algorithm(op: str, nbytes: float, p: int, per_node: list[int], cluster: Cluster) -> str:
    """The algorithm the runtime picks (``md.collectives.choose``): below the ring/tree crossover the
    latency-bound one, above it the ring, or the hierarchical all-reduce across nodes of equal share."""
    if op in ("broadcast", "reduce"):
        return "tree"
    if op == "all_to_all":
        return "pairwise"
    if p == 1:
        return "ring"
    link = cluster.inter_link if len(per_node) > 1 else cluster.intra_link
    a, b = link.alpha, link.beta
    full = nbytes  # this module counts every buffer as the full one, as collective_time does
    if p > 2:
        lg = np.log2(p)
        n_star = a * b * (2 * (p - 1) - 2 * lg) / (2 * lg - 2 * (p - 1) / p)
    else:
        n_star = a * b
    if full < n_star:
        if op == "all_reduce":
            doubling = collective_time(op, full, p, a, b, "recursive_doubling")
            rabenseifner = collective_time(op, full, p, a, b, "halving_doubling")
            return "recursive_doubling" if doubling <= rabenseifner else "halving_doubling"
        return "halving_doubling" if p > 2 else "ring"
    slower = cluster.inter_link.beta < cluster.intra_link.beta or cluster.inter_link.alpha > cluster.intra_link.alpha
    if op == "all_reduce" and len(per_node) > 1 and slower and len(set(per_node)) == 1:
        return "hierarchical"
    return "ring"


def _collective(op: str, nbytes: float, group: tuple[int, list[int]], cluster: Cluster,
                algorithm: str | None = None) -> float:
    p, per_node = group
    if p == 1:
        return 0.0
    alg = algorithm or runtime_algorithm(op, nbytes, p, per_node, cluster)
    if alg == "hierarchical":
        g, n = per_node[0], len(per_node)
        return hierarchical_all_reduce_time(nbytes, g, n, cluster.intra_link.alpha, cluster.intra_link.beta,
                                            cluster.inter_link.alpha, cluster.inter_link.beta)
    link = cluster.inter_link if len(per_node) > 1 else cluster.intra_link
    return collective_time(op, nbytes, p, link.alpha, link.beta, alg)


def check_supported(model, parallel) -> None:
    """Refuse, by name, what this model does not cover yet."""
    missing = []
    pieces = parallel.pp * parallel.virtual_stages
    if parallel.pp > 1 and (parallel.schedule not in ("1f1b", "gpipe", "interleaved") or parallel.zero_stage > 1
                            or parallel.pp_balance != "even" or model.n_layers % pieces):
        missing.append("pipelines other than gpipe, 1f1b and interleaved with ZeRO <= 1 and an even cut of the layers")
    if parallel.cp > 1 and (parallel.cp_method != "ring" or parallel.cp_layout != "zigzag"):
        missing.append("context parallelism other than ring attention on the zigzag layout")
    if parallel.ep > 1 and not model.n_experts:
        missing.append("expert parallelism without experts")
    if model.n_experts and (parallel.tp > 1 or parallel.pp > 1 or parallel.cp > 1 or parallel.zero_stage
                            or parallel.fsdp or parallel.recompute is not None):
        missing.append("mixture-of-experts layers with tp, pp, cp, ZeRO or recomputation (dp and ep are covered)")
    if model.n_experts and (model.mlp != "gelu" or model.norm != "layernorm" or not model.bias):
        missing.append("mixture-of-experts layers in a GPT other than GELU experts, layer norm and biases")
    if model.n_experts and (model.capacity_factor is not None or model.shared_expert):
        missing.append("mixture-of-experts layers with a capacity limit or a shared expert")
    if parallel.fsdp:
        missing.append("FSDP's root unit")
    if parallel.zero_stage == 3 and (parallel.pp > 1 or parallel.recompute is not None):
        missing.append("ZeRO-3 with a pipeline or recomputation")
    if parallel.sequence_parallel:
        missing.append("sequence parallelism")
    if parallel.recompute == "selective":
        missing.append("selective recomputation")
    if parallel.offload is not None:
        missing.append("offloading")
    if model.tie_embeddings:
        missing.append("tied embeddings")
    if model.n_kv_heads != model.n_heads and parallel.cp > 1:
        missing.append("grouped-query attention with context parallelism")
    if getattr(model, "window", None) is not None:
        missing.append("sliding-window attention")
    if getattr(model, "kv_latent", None) is not None:
        missing.append("latent attention (kv_latent)")
    if missing:
        raise ValueError("predict_train: not modelled yet: " + ", ".join(missing))


def _buckets(sizes: list[int], bucket_elems: float, dp: int) -> list[tuple[int, int]]:
    """``data_parallel.make_buckets`` over the parameters in the order their gradients finish (``sizes``):
    cut after the one that fills a bucket. Per bucket: how many parameters it holds, its size padded to a
    multiple of ``dp``."""
    out, count, size = [], 0, 0
    for n in sizes:
        count, size = count + 1, size + n
        if size >= bucket_elems:
            out.append((count, -(-size // dp) * dp))
            count = size = 0
    if count:
        out.append((count, -(-size // dp) * dp))
    return out


def _even_cut(layers: int, pieces: int) -> list[tuple[int, int]]:
    size = layers // pieces
    return [(j * size, (j + 1) * size) for j in range(pieces)]


def _segments(lo: int, hi: int, every: int | None, first: int | None) -> list[tuple[int, bool]]:
    """``md.parallel.recompute.segments`` as (layers, checkpointed) pairs."""
    if every is None:
        return [(1, False)] * (hi - lo)
    if first is not None:
        return [(1, i < lo + first) for i in range(lo, hi)]
    return [(min(i + every, hi) - i, True) for i in range(lo, hi, every)]


class _Stage:
    """What one virtual stage computes, its forward and backward op lists (a checkpointed segment runs its
    forward again before its backward), the activations it keeps from forward to backward and the largest
    segment it rebuilds, and its parameters in the order their gradients finish."""

    def __init__(self, x: Shard, segments: list[tuple[int, bool]], first: bool, last: bool) -> None:
        self.first, self.last = first, last
        acts = activation_bytes(x)
        forward_ops, backward_ops = block_forward, block_backward
        head_fwd, head_bwd = head_forward(x), head_backward(x)
        if x.n_experts:  # every block's MLP is a mixture of experts (moe_ops.py); the loss adds their aux losses
            acts["block"] = moe_block_activation_bytes(x)
            forward_ops, backward_ops = moe_block_forward, moe_block_backward
            head_fwd, head_bwd = moe_head_forward(x, len(segments)), moe_head_backward(x, len(segments))
        fwd, bwd, held, rebuilt, freed, self.rebuilt_after_frees = [], [], 0.0, 0.0, 0.0, 0.0
        for k, checkpointed in segments:
            fwd += forward_ops(x) * k
            bwd = (forward_ops(x) * k if checkpointed else []) + backward_ops(x) * k + bwd
            held += x.t * x.h * x.e if checkpointed else k * acts["block"]  # a checkpoint keeps its output only
            rebuilt = max(rebuilt, k * acts["block"] if checkpointed else 0.0)
        for k, checkpointed in reversed(segments):
            # without a pipeline each segment lets go of its activations once its backward is done, so a
            # segment rebuilt late in the backward finds the later segments' memory already free
            if checkpointed:
                self.rebuilt_after_frees = max(self.rebuilt_after_frees, k * acts["block"] - freed)
            freed += x.t * x.h * x.e if checkpointed else k * acts["block"]
        self.forward = (embed_forward(x) if first else []) + fwd + (head_fwd if last else [])
        self.backward = (head_bwd if last else []) + bwd + (embed_backward(x) if first else [])
        self.held = held + (acts["embed"] if first else 0.0) + (acts["head"] if last else 0.0)
        self.rebuilt = rebuilt
        # the activations alive while each backward op runs: a segment lets go of its memory (and of what it
        # rebuilt) when its input's gradient is in, after the gradients of its weights
        alive, left = [], self.held
        alive += [left] * (len(head_bwd) if last else 0)
        for k, checkpointed in reversed(segments):
            ops = (len(forward_ops(x)) if checkpointed else 0) * k + len(backward_ops(x)) * k
            alive += [left + (k * acts["block"] if checkpointed else 0.0)] * ops
            left -= x.t * x.h * x.e if checkpointed else k * acts["block"]
        alive += [left] * (len(embed_backward(x)) if first else 0)
        self.alive = alive
        self.finish_order = [n for op in self.backward for n in op.grads]


def predict_train(model, parallel, global_batch: int, cluster: Cluster | None = None, *, dtype: str = "float64",
                  optimizer: str = "adamw", steps: int = 2) -> Prediction:
    """The step time and peak memory ``md.parallel.train(model, parallel, steps, global_batch)`` will measure.

    ``model`` is an ``md.nn.GPTConfig``, ``parallel`` an ``md.parallel.ParallelConfig``, ``cluster`` a
    ``md.hardware.Cluster`` (default: the one ``train`` uses). ``step_time`` is the last of ``steps`` steps,
    the slowest rank's: pipeline stages start a step when they finish the previous one, so the first step
    can differ from the next.
    """
    fn = "predict_train"
    for name, obj, attrs in (("model", model, ("vocab_size", "seq_len", "d_model", "n_layers", "n_heads", "d_ff")),
                             ("parallel", parallel, ("dp", "tp", "pp", "cp", "ep", "zero_stage", "microbatches"))):
        missing = [a for a in attrs if not hasattr(obj, a)]
        if missing:
            kind = "an md.nn.GPTConfig" if name == "model" else "an md.parallel.ParallelConfig"
            raise TypeError(f"{fn}: {name} must be {kind}, got {type(obj).__name__} without {missing}")
    count(fn, "global_batch", global_batch)
    count(fn, "steps", steps)
    choice(fn, "optimizer", optimizer, tuple(MOMENTS))
    check_supported(model, parallel)
    cluster = Cluster() if cluster is None else cluster
    e = np.dtype(dtype).itemsize
    peak = cluster.gpu.peak(cluster.compute_dtype or dtype)
    bw = cluster.gpu.hbm_bw
    tp, dp, pp, m, L = parallel.tp, parallel.dp, parallel.pp, parallel.microbatches, model.n_layers
    v = parallel.virtual_stages
    dp_ep = dp * parallel.ep  # the ranks that split the batch (experts live on ep ranks, the tokens too)
    if global_batch % (dp_ep * m):
        raise ValueError(f"predict_train: global_batch={global_batch} must split evenly over dp x ep x microbatches "
                         f"= {dp_ep * m} (uneven splits are not modelled)")
    groups = _groups(parallel, cluster)
    shards = groups["grad"][0]  # the replicas of a weight: dp x cp (x ep), over which gradients are summed
    cp = parallel.cp
    if model.n_experts and model.n_experts % parallel.ep:
        raise ValueError(f"predict_train: {model.n_experts} experts cannot be split over ep={parallel.ep} ranks")
    x = Shard(global_batch // (dp_ep * m), model.seq_len // cp, model.d_model, model.n_heads, model.d_ff,
              model.vocab_size, tp, e, cp, model.n_experts, model.top_k if model.n_experts else 0, parallel.ep,
              groups["grad"][0], model.n_kv_heads, model.mlp, model.norm, model.bias)
    algorithm = parallel.algorithm

    model = cluster.kernel_model
    fmt = peak_format(cluster.gpu, cluster.compute_dtype or dtype)[0]
    fp32 = cluster.gpu.peak("fp32") if "fp32" in cluster.gpu.peak_flops else peak

    def compute(st: _Streams, name: str, flops: float, nbytes: float, shape: tuple = (), term: str = "compute"
                ) -> None:
        """One op on the compute stream, priced as the simulator's clock prices it (``Cluster.kernels``)."""
        if model.ideal:
            st.run(max(flops / peak, nbytes / bw), term)
        else:
            st.kernels(model.kernels(name, flops, nbytes, fmt, peak, bw, fp32, shape), term)

    def cost(op: Op) -> float:
        return _collective(op.kind, op.nbytes, groups[op.axis], cluster, _offered(op.kind, algorithm))

    cp_link = cluster.intra_link if len(groups["cp"][1]) == 1 else cluster.inter_link

    def run(st: _Streams, ops: list[Op]) -> None:
        for op in ops:
            if op.kind == "compute":
                compute(st, op.name, op.flops, op.nbytes, op.shape)
            elif op.kind == "ring":
                _ring(st, op, cp_link.alpha + op.nbytes / cp_link.beta, compute)
            else:
                st.sync(cost(op), op.axis)

    nvs = pp * v
    every = 1 if parallel.recompute == "full" else parallel.recompute if isinstance(parallel.recompute, int) else None
    stages = [_Stage(x, _segments(lo, hi, every, parallel.recompute_layers), j == 0, j == nvs - 1)
              for j, (lo, hi) in enumerate(_even_cut(L, nvs))]
    # a rank's parameters, in the order their gradients finish: its virtual stages from the last
    finish = [[n for c in reversed(range(v)) for n in stages[c * pp + r].finish_order] for r in range(pp)]
    buckets = [_buckets(f, parallel.bucket_bytes / e, shards) for f in finish]
    if x.n_experts:  # two reducers (expert_data_parallel.py): dense weights over the data group, experts over dp
        dense, experts = moe_parameters(x, L)
        buckets = [_buckets(dense[::-1], parallel.bucket_bytes / e, shards)]
        expert_bks = [b for ex in experts[::-1] for b in _buckets(ex[::-1], parallel.bucket_bytes / e,
                                                                      groups["expert"][0])]
        finish = [dense + [n for ex in experts for n in ex]]
    stage = parallel.zero_stage
    reduce_op = "all_reduce" if stage == 0 else "reduce_scatter"
    # held from a pass's forward to its backward: its units' activations, the received input (not on the first
    # stage), and on the last stage the loss scaled inside the graph (the product and the weight it keeps)
    held = [st.held + (0.0 if st.first else x.t * x.h * e) + (2 * e if st.last and pp > 1 else 0.0)
            for st in stages]

    def reduce(st: _Streams, bks) -> None:
        """After a pipeline the data-parallel buckets reduce one after another; the program waits for all."""
        ends = []
        for _, n in bks:
            ends.append(st.launch(cost(Op(reduce_op, 0, n * e, reduce_op, "grad"))))
        if ends:
            st.wait(max(ends), "dp")

    ranks = [_Streams() for _ in range(pp)]
    windows = []
    buffered = (0.0, 0.0)  # ZeRO-2: (activations, bucket buffers) when the two together are largest
    peak_acts = [0.0] * pp
    for _ in range(steps):
        starts = [r.compute for r in ranks]
        if stage == 3:
            padded3, peak3 = sharded_step(ranks[0], x, L, m, shards, parallel.prefetch, run, cost)
        elif x.n_experts:
            _moe_step(ranks[0], stages[0], m, buckets[0], expert_bks, run, cost, e)
            peak_acts[0] = held[0]
        elif pp == 1:
            buffered = _single_stage_step(ranks[0], stages[0], buckets[0], m, shards, stage, reduce_op, run, cost,
                                          e)
            peak_acts[0] = held[0] + stages[0].rebuilt_after_frees
        else:
            hops = _stage_hops(parallel, cluster, x.t * x.h * e)
            orders = stage_orders(parallel.schedule, pp, m, v)
            _walk(ranks, orders, stages, hops, run, peak_acts, held)
            for r, st in enumerate(ranks):
                if shards > 1:
                    reduce(st, buckets[r])
        for r, st in enumerate(ranks):
            shard = sum(n // shards for _, n in buckets[r]) if stage else sum(finish[r])
            if stage == 3:
                shard = sum(padded3) // shards
            compute(st, "optimizer.step", 0, optimizer_bytes(shard, e, optimizer), term="optimizer")
            if stage in (1, 2) and shards > 1:
                for _, n in buckets[r]:
                    st.sync(cost(Op("all_gather", 0, n * e, "all_gather", "grad")), "dp")
            st.wait(max(st.compute, st.comm), "dp")
        windows = [st.compute - s0 for st, s0 in zip(ranks, starts)]

    totals = [sum(n for _, n in buckets[r]) * e * (2 + MOMENTS[optimizer]) + peak_acts[r] for r in range(pp)]
    worst = int(np.argmax(totals))  # the fullest stage (state counted as for ZeRO-0, enough to rank them)
    padded = sum(n for _, n in buckets[worst])
    shard = sum(n // shards for _, n in buckets[worst]) if stage else sum(finish[worst])
    memory = {"params": padded * e,
              "grads": (shard if stage == 2 else padded) * e,
              "optimizer": (shard if stage else padded) * e * MOMENTS[optimizer],
              "activations": peak_acts[worst],
              "buffers": 0.0}
    if sum(buffered) > peak_acts[worst]:  # ZeRO-2's gradient buckets, late in a backward that kept little
        memory["activations"], memory["buffers"] = buffered
    if x.n_experts:
        padded += sum(n for _, n in expert_bks)
        memory.update(params=padded * e, grads=padded * e, optimizer=padded * e * MOMENTS[optimizer])
    if stage == 3:
        shard = sum(padded3) // shards
        memory = {"params": shard * e, "grads": shard * e, "optimizer": shard * e * MOMENTS[optimizer], **peak3}
    memory["total"] = sum(memory.values())
    slow = int(np.argmax(windows))
    terms = {k: ranks[slow].terms.get(k, 0.0) / steps for k in ("compute", "tp", "pp", "dp", "optimizer")}
    if x.n_experts:  # the routing's own communication: the count exchange and the all-to-alls
        terms["ep"] = sum(ranks[slow].terms.get(k, 0.0) for k in ("ep", "grad")) / steps
    return Prediction(max(windows), terms, memory)


def _single_stage_step(st, stage, buckets, m, dp, zero, reduce_op, run, cost, e) -> tuple[float, float]:
    """Micro-batches one after another; the buckets reduce as the backward completes them (on the last
    micro-batch for DDP and ZeRO-1, which accumulate locally; on every one for ZeRO-2). Returns ZeRO-2's
    largest (activations, bucket buffers): a bucket is a transient buffer from the moment its first gradient
    arrives until the next one's does (after it was reduced), so at most two are alive."""
    largest = (0.0, 0.0)

    def buffers(k: int) -> float:  # ZeRO-2's bucket buffers alive once k were allocated: the last two
        return sum(n for _, n in buckets[max(k - 2, 0):k]) * e

    for i in range(m):
        reduce_now = zero == 2 or dp > 1 and i == m - 1
        run(st, stage.forward)
        finished, next_bucket, need, ends = 0, 0, buckets[0][0], []
        started, first = 0, 0  # ZeRO-2: the buckets allocated so far, the index of the next one's first gradient
        for op, alive in zip(stage.backward, stage.alive):
            run(st, [op])
            finished += len(op.grads)
            while zero == 2 and started < len(buckets) and finished > first:
                # the bucket's first gradient is in: its buffer is allocated beside the previous one (reducing),
                # and the two stay alive until the next bucket's first gradient (beside any segment rebuilt meanwhile)
                first, started = first + buckets[started][0], started + 1
                largest = max(largest, (alive, buffers(started)), key=sum)
            if zero == 2:
                largest = max(largest, (alive, buffers(started)), key=sum)
            while reduce_now and next_bucket < len(buckets) and finished >= need:
                # the bucket's last gradient is in: its reduction starts on the communication stream
                nbytes = buckets[next_bucket][1] * e
                if dp > 1:
                    ends.append(st.launch(cost(Op(reduce_op, 0, nbytes, reduce_op, "grad"))))
                next_bucket += 1
                need += buckets[next_bucket][0] if next_bucket < len(buckets) else 0
        if ends:
            st.wait(max(ends), "dp")
    return largest


def _moe_step(st, stage, m, dense_buckets, expert_buckets, run, cost, e) -> None:
    """Micro-batches one after another, each gradient accumulated locally; then, as ``ExpertDataParallel``
    does, every dense bucket's all-reduce over the data group, a wait, every expert bucket's over its
    replicas (dp), a wait: no reduction overlaps the backward."""
    for _ in range(m):
        run(st, stage.forward)
        run(st, stage.backward)
    for bks, axis in ((dense_buckets, "grad"), (expert_buckets, "expert")):
        ends = [st.launch(cost(Op("all_reduce", 0, n * e, "all_reduce", axis))) for _, n in bks]
        if ends:
            st.wait(max(ends), "dp")


def _stage_hops(parallel, cluster: Cluster, nbytes: float) -> list[list[float]]:
    """Seconds of one activation message between pipeline ranks ``[a][b]``: over the node's links, or the
    network's where the two stages sit on different nodes (pp is the mesh's outermost axis, so a world of more
    than one node splits the pipeline first). Every pipeline group has the same pattern; rank 0's is taken."""
    stride = int(np.prod([getattr(parallel, a) for a in AXES[1:]]))
    node = [s * stride // cluster.gpus_per_node for s in range(parallel.pp)]

    def hop(a: int, b: int) -> float:
        link = cluster.intra_link if node[a] == node[b] else cluster.inter_link
        return link.alpha + nbytes / link.beta

    return [[hop(a, b) for b in range(parallel.pp)] for a in range(parallel.pp)]


def _walk(ranks: list[_Streams], orders, stages: list[_Stage], hops: list[list[float]], run, peak_acts,
          held) -> None:
    """Every pipeline rank runs its passes in its schedule's order, as ``PipelineExecutor`` does: a receive
    right before a pass whose input is on another rank (blocking), a send right after one whose output
    another rank needs (asynchronous, waited for at the end of the step)."""
    p = len(ranks)
    nvs = len(stages)
    pos = [0] * p
    arrived: dict[tuple, float] = {}
    sends: list[list[float]] = [[] for _ in range(p)]
    live = [0.0] * p
    while any(pos[r] < len(orders[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                op, mb, chunk = orders[r][pos[r]]
                vs = chunk * p + r
                src = vs - 1 if op == "F" else vs + 1
                if 0 <= src < nvs and src % p != r:
                    key = (op, mb, src)
                    if key not in arrived:
                        break
                    ranks[r].recv(arrived.pop(key), "pp")
                st = ranks[r]
                if op == "F":
                    run(st, stages[vs].forward)
                    live[r] += held[vs]
                    peak_acts[r] = max(peak_acts[r], live[r])
                else:
                    peak_acts[r] = max(peak_acts[r], live[r] + stages[vs].rebuilt)
                    run(st, stages[vs].backward)
                    live[r] -= held[vs]
                dst = vs + 1 if op == "F" else vs - 1
                if 0 <= dst < nvs and dst % p != r:
                    t = st.send(("pp", dst % p), hops[r][dst % p])
                    arrived[(op, mb, vs)] = t
                    sends[r].append(t)
                pos[r] += 1
                moved = True
        if not moved:
            raise RuntimeError("predict_train: the pipeline schedule deadlocks")  # stage_orders never does
    for r in range(p):
        if sends[r]:
            ranks[r].wait(max(sends[r]), "pp")


def _offered(op: str, algorithm: str | None) -> str | None:
    """A layout's ``algorithm`` applies to the collectives that offer it (NCCL_ALGO's rule)."""
    offered = {"all_reduce": ("ring", "tree", "halving_doubling", "bidirectional_ring", "recursive_doubling",
                              "hierarchical"),
               "reduce_scatter": ("ring", "halving_doubling"), "all_gather": ("ring", "halving_doubling")}
    return algorithm if algorithm in offered.get(op, ()) else None


def _ring(st: _Streams, op: Op, hop: float, compute) -> None:
    """Ring attention (``md.parallel.context.context_parallel.RingAttention``) on one rank of a symmetric ring: each
    step posts the K/V block to the successor and takes the predecessor's (the same arrival time, by
    symmetry), computes its blocks meanwhile, then waits. The backward also passes each block's gradient
    accumulator on after every step, behind the K/V message on the same link, and receives its own home."""
    name = "attention.block" + (".backward" if op.name.endswith("backward") else "")

    def blocks(step) -> None:
        for flops, nbytes in step:
            compute(st, name, flops, nbytes)

    p = len(op.steps)
    if not op.name.endswith("backward"):
        for t, step in enumerate(op.steps):
            arrival = st.send(("cp", 1), hop) if t < p - 1 else None
            blocks(step)
            if arrival is not None:
                st.wait(arrival, "cp")
        return
    acc = None  # arrival of the accumulator sent at the previous step
    for t, step in enumerate(op.steps):
        ends = [st.send(("cp", 1), hop)] if t < p - 1 else []
        blocks(step)
        st.wait(max(ends + ([acc] if acc is not None else []) + [st.compute]), "cp")
        acc = st.send(("cp", 1), hop)
    st.wait(acc, "cp")
