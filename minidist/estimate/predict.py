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
ZeRO stages 0-2, on dense GPTs with minidist's defaults (GELU MLP, layer norm, biases, multi-head
attention, untied embeddings). Other layouts raise ValueError naming what is not modelled yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

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
    parameters,
)
from minidist.hardware.cluster import Cluster

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


class _Streams:
    """One rank's compute and communication streams (``hardware.clock.Clock`` in closed form)."""

    def __init__(self) -> None:
        self.compute = 0.0
        self.comm = 0.0
        self.terms: dict[str, float] = {}

    def add(self, term: str, seconds: float) -> None:
        self.terms[term] = self.terms.get(term, 0.0) + seconds

    def run(self, seconds: float, term: str) -> None:
        self.compute += seconds
        self.add(term, seconds)

    def sync(self, seconds: float, term: str) -> None:
        """A synchronous collective: after the program and after earlier communication."""
        start = max(self.compute, self.comm)
        self.add(term, start - self.compute + seconds)  # waiting for the comm stream counts as exposed
        self.compute = self.comm = start + seconds

    def launch(self, seconds: float) -> float:
        """An asynchronous collective on the communication stream; returns its end."""
        self.comm = max(self.compute, self.comm) + seconds
        return self.comm

    def wait(self, end: float, term: str) -> None:
        if end > self.compute:
            self.add(term, end - self.compute)
            self.compute = end
        self.comm = max(self.comm, end)


def _groups(parallel, cluster: Cluster) -> dict[str, tuple[int, list[int]]]:
    """Per axis (and the flattened data-parallel group): its size and how many of its ranks share each node,
    for the group that holds rank 0 (every group of an axis has the same shape)."""
    shape = [getattr(parallel, a) for a in AXES]
    ranks = np.arange(int(np.prod(shape))).reshape(shape)
    out = {}
    for name, axes in {**{a: (a,) for a in AXES}, "grad": ("dp", "ep", "cp")}.items():
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
    if parallel.pp > 1:
        missing.append("pipeline parallelism (pp > 1)")
    if parallel.cp > 1:
        missing.append("context parallelism (cp > 1)")
    if parallel.ep > 1 or model.n_experts:
        missing.append("mixture-of-experts layers")
    if parallel.zero_stage == 3 or parallel.fsdp:
        missing.append("ZeRO-3 / FSDP")
    if parallel.sequence_parallel:
        missing.append("sequence parallelism")
    if parallel.recompute is not None:
        missing.append("recomputation")
    if parallel.offload is not None:
        missing.append("offloading")
    if model.mlp != "gelu" or model.norm != "layernorm" or not model.bias or model.tie_embeddings:
        missing.append("a GPT other than GELU + layer norm + biases + untied embeddings")
    if model.n_kv_heads != model.n_heads:
        missing.append("grouped-query attention")
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


def predict_train(model, parallel, global_batch: int, cluster: Cluster | None = None, *, dtype: str = "float64",
                  optimizer: str = "adamw") -> Prediction:
    """The step time and peak memory ``md.parallel.train(model, parallel, global_batch=...)`` will measure.

    ``model`` is an ``md.nn.GPTConfig``, ``parallel`` an ``md.parallel.ParallelConfig``, ``cluster`` a
    ``md.hardware.Cluster`` (default: the one ``train`` uses). Times are for a step after the first (the
    same here: the simulator's steps are identical).
    """
    check_supported(model, parallel)
    cluster = Cluster() if cluster is None else cluster
    e = np.dtype(dtype).itemsize
    peak = cluster.gpu.peak(cluster.compute_dtype or dtype)
    bw = cluster.gpu.hbm_bw
    tp, dp, m, L = parallel.tp, parallel.dp, parallel.microbatches, model.n_layers
    if global_batch % (dp * m):
        raise ValueError(f"predict_train: global_batch={global_batch} must split evenly over dp x microbatches "
                         f"= {dp * m} (uneven splits are not modelled)")
    groups = _groups(parallel, cluster)
    x = Shard(global_batch // (dp * m), model.seq_len, model.d_model, model.n_heads, model.d_ff, model.vocab_size,
              tp, e)
    algorithm = parallel.algorithm

    def cost(op: Op) -> float:
        if op.kind == "compute":
            return max(op.flops / peak, op.nbytes / bw)
        return _collective(op.kind, op.nbytes, groups[op.axis], cluster, _offered(op.kind, algorithm))

    def run(st: _Streams, ops: list[Op]) -> None:
        for op in ops:
            if op.kind == "compute":
                st.run(cost(op), "compute")
            else:
                st.sync(cost(op), op.axis)

    order = parameters(x, L)[::-1]  # the order the backward finishes gradients: buckets follow it
    local = sum(order)
    buckets = _buckets(order, parallel.bucket_bytes / e, dp)
    stage = parallel.zero_stage
    reduce_op = "all_reduce" if stage == 0 else "reduce_scatter"

    st = _Streams()
    for i in range(m):
        reduce_now = dp > 1 and (i == m - 1 or stage == 2)  # DDP and ZeRO-1 accumulate until the last one
        run(st, embed_forward(x))
        for _ in range(L):
            run(st, block_forward(x))
        run(st, head_forward(x))
        backward = head_backward(x) + block_backward(x) * L + embed_backward(x)
        finished, next_bucket, need, ends = 0, 0, buckets[0][0], []
        for op in backward:
            run(st, [op])
            finished += len(op.grads)
            while reduce_now and next_bucket < len(buckets) and finished >= need:
                # the last gradient of the bucket is in: its reduction starts on the communication stream
                ends.append(st.launch(cost(Op(reduce_op, 0, buckets[next_bucket][1] * e, reduce_op, "grad"))))
                next_bucket += 1
                need += buckets[next_bucket][0] if next_bucket < len(buckets) else 0
        if ends:
            st.wait(max(ends), "dp")
    shard = sum(n // dp for _, n in buckets) if stage else local
    st.run(max(0.0, optimizer_bytes(shard, e, optimizer) / bw), "optimizer")
    if stage in (1, 2) and dp > 1:
        for _, n in buckets:
            st.sync(cost(Op("all_gather", 0, n * e, "all_gather", "grad")), "dp")
    step = max(st.compute, st.comm)

    padded = sum(n for _, n in buckets)
    acts = activation_bytes(x)
    memory = {"params": padded * e,
              "grads": (shard if stage == 2 else padded) * e,
              "optimizer": (shard if stage else padded) * e * MOMENTS[optimizer],
              "activations": acts["embed"] + L * acts["block"] + acts["head"],
              "buffers": 0.0}
    memory["total"] = sum(memory.values())
    terms = {k: st.terms.get(k, 0.0) for k in ("compute", "tp", "dp", "optimizer")}
    return Prediction(step, terms, memory)


def _offered(op: str, algorithm: str | None) -> str | None:
    """A layout's ``algorithm`` applies to the collectives that offer it (NCCL_ALGO's rule)."""
    offered = {"all_reduce": ("ring", "tree", "halving_doubling", "bidirectional_ring", "recursive_doubling",
                              "hierarchical"),
               "reduce_scatter": ("ring", "halving_doubling"), "all_gather": ("ring", "halving_doubling")}
    return algorithm if algorithm in offered.get(op, ()) else None
