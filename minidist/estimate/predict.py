"""Predict a run of ``md.parallel.train`` before it runs: step time and memory of a layout, term by term
(book ch6, ch27; lab 18).

Property: the simulator charges every op by the roofline and every message by alpha-beta, so a step's
time is a sum of closed forms once the ops (``gpt_ops``), the collectives each strategy adds and the
order they run in are known. This model walks one rank's step in that order with two streams, as the
simulated clock does: compute ops and synchronous collectives (tensor parallelism, the ZeRO all-gathers)
advance the program, and a synchronous collective also waits for the communication stream; the
data-parallel buckets run on the communication stream as the backward releases them (``stage_ops.py``:
what each stage runs and holds; ``step_walks.py``: the order each kind of step runs in). Predicting
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
from minidist.estimate.gpt_ops import Op, Shard, optimizer_bytes
from minidist.estimate.moe_ops import moe_parameters
from minidist.estimate.pipeline import stage_orders
from minidist.estimate.sharded_step import sharded_step
from minidist.estimate.stage_ops import Stage, cut_buckets, even_cut, segments
from minidist.estimate.step_walks import moe_step, ring_attention_pass, single_stage_step, walk_pipeline
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
    if getattr(model, "dense_layers", 0) and model.n_experts:
        missing.append("dense layers before the expert layers (dense_layers)")
    if missing:
        raise ValueError("predict_train: not modelled yet: " + ", ".join(missing))


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
                ring_attention_pass(st, op, cp_link.alpha + op.nbytes / cp_link.beta, compute)
            else:
                st.sync(cost(op), op.axis)

    nvs = pp * v
    every = 1 if parallel.recompute == "full" else parallel.recompute if isinstance(parallel.recompute, int) else None
    stages = [Stage(x, segments(lo, hi, every, parallel.recompute_layers), j == 0, j == nvs - 1)
              for j, (lo, hi) in enumerate(even_cut(L, nvs))]
    # a rank's parameters, in the order their gradients finish: its virtual stages from the last
    finish = [[n for c in reversed(range(v)) for n in stages[c * pp + r].finish_order] for r in range(pp)]
    buckets = [cut_buckets(f, parallel.bucket_bytes / e, shards) for f in finish]
    if x.n_experts:  # two reducers (expert_data_parallel.py): dense weights over the data group, experts over dp
        dense, experts = moe_parameters(x, L)
        buckets = [cut_buckets(dense[::-1], parallel.bucket_bytes / e, shards)]
        expert_bks = [b for ex in experts[::-1] for b in cut_buckets(ex[::-1], parallel.bucket_bytes / e,
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
            moe_step(ranks[0], stages[0], m, buckets[0], expert_bks, run, cost, e)
            peak_acts[0] = held[0]
        elif pp == 1:
            buffered = single_stage_step(ranks[0], stages[0], buckets[0], m, shards, stage, reduce_op, run, cost,
                                          e)
            peak_acts[0] = held[0] + stages[0].rebuilt_after_frees
        else:
            hops = _stage_hops(parallel, cluster, x.t * x.h * e)
            orders = stage_orders(parallel.schedule, pp, m, v)
            walk_pipeline(ranks, orders, stages, hops, run, peak_acts, held)
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


def _offered(op: str, algorithm: str | None) -> str | None:
    """A layout's ``algorithm`` applies to the collectives that offer it (NCCL_ALGO's rule)."""
    offered = {"all_reduce": ("ring", "tree", "halving_doubling", "bidirectional_ring", "recursive_doubling",
                              "hierarchical"),
               "reduce_scatter": ("ring", "halving_doubling"), "all_gather": ("ring", "halving_doubling")}
    return algorithm if algorithm in offered.get(op, ()) else None

