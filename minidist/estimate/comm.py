"""The alpha-beta cost of collectives (book ch4, ch11-13a; labs 02, 05-07).

Property: a message of ``n`` bytes costs ``alpha + n / beta`` (alpha = latency in seconds, beta =
bandwidth in bytes/s per direction), and every collective is a schedule of such messages, so its
cost is a closed form in ``p`` (ranks), ``n``, alpha and beta. The simulated runtime must reproduce
these numbers exactly on uniform links; that is why the formulas here are written out literally.

Conventions: ``nbytes`` is the *full* buffer: the all-reduce input, the all-gather output, the
reduce-scatter input, the per-rank total of an all-to-all, the root's whole buffer for scatter and
gather. For tree algorithms on a ``p`` that is not a power of two we use ``ceil(log2 p)`` rounds.
``p == 1`` costs 0 for every collective (nothing moves).
"""

from __future__ import annotations

import math

from minidist.estimate._check import choice, count, fraction, nonnegative, positive

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "scatter", "gather", "all_to_all",
       "send_recv")
ALGORITHMS = ("ring", "tree", "halving_doubling", "bidirectional_ring", "pairwise", "recursive_doubling")

# Which algorithms each op has a model for. Rooted ops (broadcast, reduce, scatter, gather) and
# all_to_all have one standard algorithm; for them the default "ring" means "the op's standard
# algorithm" so that collective_time(op, n, p, a, b) works for every op without naming one.
SUPPORTED = {
    "all_reduce": ("ring", "tree", "halving_doubling", "bidirectional_ring", "recursive_doubling"),
    "reduce_scatter": ("ring", "halving_doubling"),
    "all_gather": ("ring", "halving_doubling"),
    "broadcast": ("tree",),
    "reduce": ("tree",),
    "scatter": ("tree",),
    "gather": ("tree",),
    "all_to_all": ("pairwise",),
    "send_recv": ALGORITHMS,
}


def _log2_ceil(p: int) -> int:
    return (p - 1).bit_length()  # ceil(log2 p) for p >= 1, exact for integers


def _log2_floor(p: int) -> int:
    return p.bit_length() - 1


def collective_time(op: str, nbytes: float, p: int, alpha: float, beta: float, algorithm: str = "ring") -> float:
    """Seconds for collective ``op`` on ``p`` ranks moving a buffer of ``nbytes`` (alpha-beta model).

    Formulas (n = nbytes, a = alpha, b = beta, lg = ceil(log2 p)):

    - all_reduce ring: 2(p-1) a + 2(p-1)/p n/b (reduce-scatter then all-gather)
    - all_reduce tree: (fl + lg)(a + n/b) with fl = floor(log2 p): a binomial reduce then a binomial
      broadcast of the whole buffer, 2 log2(p)(a + n/b) when p is a power of two. The reduce needs only
      fl rounds: when p is not a power of two the odd child arrives early on its own link (see reduce).
    - all_reduce halving_doubling (Rabenseifner): 2 log2(p) a + 2(p-1)/p n/b for p = 2^k. For other p,
      the r = p - 2^k extra ranks first fold their buffer into a partner and get the result back at the
      end: 2 (a + n/b) more, plus the power-of-two formula on p' = 2^k.
    - all_reduce recursive_doubling: log2(p) (a + n/b) for p = 2^k: every round swaps the whole buffer with
      the partner 2^i ranks away; other p fold the extra ranks in first, as halving_doubling does.
    - all_reduce bidirectional_ring: 2(p-1) a + (p-1)/p n/b for p >= 3: two half-size rings turning in
      opposite directions on full-duplex links, each still taking 2(p-1) steps. The book's table gives
      (p-1) a, which two half-rings cannot reach. For p = 2 both directions share the same two links,
      so it is the plain ring: 2 a + n/b.
    - reduce_scatter / all_gather ring: (p-1)(a + n/(p b)); halving_doubling: lg a + (p-1)/p n/b for
      every p (recursive halving/doubling for p = 2^k, Bruck's rotated schedule otherwise; a fold of the
      extra ranks would not deliver their own chunk, so it is not used here)
    - all_to_all pairwise: (p-1)(a + n/(p b)), n = the data each rank holds in total
    - broadcast (binomial tree): lg (a + n/b)
    - reduce (binomial tree): fl (a + n/b). A parent receives its children on separate links; a child
      with no children of its own sends at once, so for p not a power of two the last round's message is
      already there when the parent gets to it and the critical path is floor(log2 p) rounds.
    - scatter / gather (binomial tree): lg a + (p-1)/p n/b (for gather an upper bound when p is not a
      power of two, for the same early-arrival reason as reduce)
    - send_recv: a + n/b (p is ignored beyond validation; the algorithm too)

    Raises ValueError naming the argument for negative sizes, p < 1, non-positive beta, an unknown op
    or algorithm, or an algorithm the op has no model for.
    """
    fn = "collective_time"
    choice(fn, "op", op, OPS)
    choice(fn, "algorithm", algorithm, ALGORITHMS)
    n = nonnegative(fn, "nbytes", nbytes)
    p = count(fn, "p", p)
    a = nonnegative(fn, "alpha", alpha)
    b = positive(fn, "beta", beta)
    if op == "send_recv":
        return a + n / b
    if algorithm == "ring" and "ring" not in SUPPORTED[op]:
        algorithm = SUPPORTED[op][0]
    if algorithm not in SUPPORTED[op]:
        raise ValueError(f"{fn}: algorithm {algorithm!r} has no model for op {op!r}; use one of {SUPPORTED[op]}")
    if p == 1:
        return 0.0
    lg = _log2_ceil(p)
    if op == "all_reduce":
        if algorithm == "ring":
            return 2 * (p - 1) * a + 2 * (p - 1) / p * n / b
        if algorithm == "tree":
            return (_log2_floor(p) + lg) * (a + n / b)
        if algorithm == "bidirectional_ring":
            if p == 2:
                return 2 * a + n / b
            return 2 * (p - 1) * a + (p - 1) / p * n / b
        k = p.bit_length() - 1  # halving_doubling or recursive_doubling on p' = 2^k, plus a fold for the rest
        q = 1 << k
        fold = 2 * (a + n / b) if q != p else 0.0
        if algorithm == "recursive_doubling":
            return fold + k * (a + n / b)
        return fold + 2 * k * a + 2 * (q - 1) / q * n / b
    if op in ("reduce_scatter", "all_gather"):
        if algorithm == "ring":
            return (p - 1) * (a + n / (p * b))
        return lg * a + (p - 1) / p * n / b
    if op == "all_to_all":
        return (p - 1) * (a + n / (p * b))
    if op == "broadcast":
        return lg * (a + n / b)
    if op == "reduce":
        return _log2_floor(p) * (a + n / b)
    return lg * a + (p - 1) / p * n / b  # scatter, gather


def hierarchical_all_reduce_time(nbytes: float, gpus_per_node: int, nodes: int, alpha_intra: float,
                                 beta_intra: float, alpha_inter: float, beta_inter: float) -> float:
    """Two-level all-reduce: ring reduce-scatter inside each node, ring all-reduce of the n/G shard
    across nodes, ring all-gather inside the node (G = gpus_per_node, N = nodes, book ch13):

        T = 2(G-1) a_intra + 2(G-1)/G n/b_intra + 2(N-1) a_inter + 2(N-1)/N (n/G)/b_inter

    beta_inter is the bandwidth each GPU has to the network (one NIC per GPU runs its own shard).
    """
    fn = "hierarchical_all_reduce_time"
    n = nonnegative(fn, "nbytes", nbytes)
    g = count(fn, "gpus_per_node", gpus_per_node)
    N = count(fn, "nodes", nodes)
    ai, bi = nonnegative(fn, "alpha_intra", alpha_intra), positive(fn, "beta_intra", beta_intra)
    ao, bo = nonnegative(fn, "alpha_inter", alpha_inter), positive(fn, "beta_inter", beta_inter)
    intra = 2 * (g - 1) * ai + 2 * (g - 1) / g * n / bi
    inter = 2 * (N - 1) * ao + 2 * (N - 1) / N * (n / g) / bo
    return intra + inter


BUS_FACTOR = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "scatter": lambda p: (p - 1) / p,
    "gather": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
    "send_recv": lambda p: 1.0,
}


def bus_bandwidth(op: str, nbytes: float, p: int, seconds: float) -> float:
    """nccl-tests bus bandwidth in bytes/s: algbw = nbytes / seconds times the op's factor
    (2(p-1)/p all_reduce; (p-1)/p reduce_scatter, all_gather, all_to_all, scatter, gather; 1 otherwise).
    busbw is comparable to the link bandwidth: a ring all-reduce that runs at the alpha-beta bound has
    busbw -> beta as n grows."""
    fn = "bus_bandwidth"
    choice(fn, "op", op, OPS)
    n = nonnegative(fn, "nbytes", nbytes)
    p = count(fn, "p", p)
    t = positive(fn, "seconds", seconds)
    return n / t * BUS_FACTOR[op](p)


def algorithm_bandwidth(nbytes: float, seconds: float) -> float:
    """algbw = nbytes / seconds (bytes/s)."""
    return nonnegative("algorithm_bandwidth", "nbytes", nbytes) / positive("algorithm_bandwidth", "seconds", seconds)


def crossover_bytes(alpha: float, beta: float) -> float:
    """n* = alpha * beta: below it a message is latency-bound, above it bandwidth-bound (ch3-4)."""
    return nonnegative("crossover_bytes", "alpha", alpha) * positive("crossover_bytes", "beta", beta)


def ring_tree_crossover_bytes(p: int, alpha: float, beta: float) -> float:
    """Size where ring and tree all-reduce cost the same (ch12):
    n* = a b (2(p-1) - 2 lg) / (2 lg - 2(p-1)/p), lg = log2 p. Above n* the ring wins."""
    fn = "ring_tree_crossover_bytes"
    p = count(fn, "p", p, minimum=3)
    a, b = nonnegative(fn, "alpha", alpha), positive(fn, "beta", beta)
    lg = math.log2(p)
    return a * b * (2 * (p - 1) - 2 * lg) / (2 * lg - 2 * (p - 1) / p)


def collective_bytes(op: str, nbytes: float, p: int) -> float:
    """Bytes each rank sends in a bandwidth-optimal ring / pairwise ``op``: 2(p-1)/p n for all_reduce,
    (p-1)/p n for reduce_scatter, all_gather and all_to_all, n for send_recv."""
    fn = "collective_bytes"
    choice(fn, "op", op, ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"))
    n = nonnegative(fn, "nbytes", nbytes)
    p = count(fn, "p", p)
    return BUS_FACTOR[op](p) * n


def hierarchical_inter_node_bytes(nbytes: float, gpus_per_node: int, nodes: int) -> float:
    """Bytes each GPU sends across the network in the two-level all-reduce: 2(N-1)/N n/G (ch13a);
    the flat ring sends 2(P-1)/P n, G times more."""
    fn = "hierarchical_inter_node_bytes"
    n = nonnegative(fn, "nbytes", nbytes)
    g, N = count(fn, "gpus_per_node", gpus_per_node), count(fn, "nodes", nodes)
    return 2 * (N - 1) / N * n / g


def bucketed_all_reduce_time(total_bytes: float, bucket_bytes: float, p: int, alpha: float, beta: float,
                             algorithm: str = "ring") -> float:
    """Gradient bucketing (ch4, ch12): ceil(total/bucket) all-reduces of one bucket each; fusing k small
    messages saves (k-1) latency terms."""
    fn = "bucketed_all_reduce_time"
    total = nonnegative(fn, "total_bytes", total_bytes)
    bucket = positive(fn, "bucket_bytes", bucket_bytes)
    calls = math.ceil(total / bucket - 1e-12)
    return calls * collective_time("all_reduce", min(bucket, total), p, alpha, beta, algorithm)


def overlapped_time(t_compute: float, t_comm: float, overlap: float = 1.0) -> float:
    """Step time when a fraction ``overlap`` of the shorter phase hides under the longer (ch13, ch31):
    T = Tc + Tm - overlap * min(Tc, Tm); overlap = 1 gives max(Tc, Tm), 0 gives the sum."""
    fn = "overlapped_time"
    tc, tm = nonnegative(fn, "t_compute", t_compute), nonnegative(fn, "t_comm", t_comm)
    f = fraction(fn, "overlap", overlap)
    return tc + tm - f * min(tc, tm)
