"""Every lab check accepts the right answer and rejects the typical wrong ones with a useful hint."""

import pytest

import minidist as md
from minidist.labs import CheckFailed


def _rejects(check, answer, *args, match=None, **kwargs):
    with pytest.raises(CheckFailed, match=match):
        check(answer, *args, **kwargs)


# --- lab 01: the extended roofline ---------------------------------------------------------------

def good_intensity(m, n, k, b):
    return 2 * m * n * k / (b * (m * k + k * n + m * n))


def test_matmul_intensity_accepts_and_rejects(capsys):
    md.labs.check_matmul_intensity(good_intensity)
    assert "ok" in capsys.readouterr().out
    _rejects(md.labs.check_matmul_intensity, lambda m, n, k, b: m * n * k / (b * (m * k + k * n + m * n)),
             match="factor of 2")
    _rejects(md.labs.check_matmul_intensity, lambda m, n, k, b: 2 * m * n * k / (m * k + k * n + m * n),
             match="per \\*byte\\*")
    _rejects(md.labs.check_matmul_intensity, lambda m, n, k, b: 2 * m * n * k / (b * (m * k + k * n)))
    _rejects(md.labs.check_matmul_intensity, lambda m, n, k, b: None, match="return")


def test_unfinished_exercise_is_named():
    def todo(*args):
        raise NotImplementedError

    _rejects(md.labs.check_matmul_intensity, todo, match="not done yet")


def test_attainable_accepts_and_rejects():
    def good(peak, bw, i, net_bw=None, i_net=None):
        b = min(peak, bw * i)
        return b if net_bw is None else min(b, net_bw * i_net)

    md.labs.check_attainable(good)
    _rejects(md.labs.check_attainable, lambda peak, bw, i, net_bw=None, i_net=None: max(peak, bw * i))
    _rejects(md.labs.check_attainable, lambda peak, bw, i, net_bw=None, i_net=None: min(peak, bw * i),
             match="network")
    _rejects(md.labs.check_attainable, lambda peak, bw, i, net_bw, i_net: min(peak, bw * i, net_bw * i_net))


def test_dp_network_intensity():
    md.labs.check_dp_network_intensity(lambda psi, b, p, s: 3 * b / (p * s))
    _rejects(md.labs.check_dp_network_intensity, lambda psi, b, p, s: 6 * b / (p * s))
    _rejects(md.labs.check_dp_network_intensity, lambda psi, b, p, s: 3 * b / p)


def test_accumulation_steps():
    md.labs.check_accumulation_steps(2, compute_ms=100, comm_ms=200)
    _rejects(md.labs.check_accumulation_steps, 1, compute_ms=100, comm_ms=200, match="still longer")
    _rejects(md.labs.check_accumulation_steps, 3, compute_ms=100, comm_ms=200, match="smallest")
    _rejects(md.labs.check_accumulation_steps, 1.5, compute_ms=100, comm_ms=200, match="whole")


# --- lab 04: scaling laws ------------------------------------------------------------------------

def test_power_law_fit_check():
    import numpy as np

    def good(N, L):
        best = None
        for l_inf in np.linspace(0.0, L.min() - 1e-4, 2000):
            slope, icpt = np.polyfit(np.log(N), np.log(L - l_inf), 1)
            err = np.sum((np.exp(icpt) / N**-slope + l_inf - L) ** 2)
            if best is None or err < best[0]:
                best = (err, np.exp(icpt), -slope, l_inf)
        return best[1:]

    def no_floor(N, L):
        slope, icpt = np.polyfit(np.log(N), np.log(L), 1)
        return np.exp(icpt), -slope, 0.0

    md.labs.check_power_law_fit(good)
    _rejects(md.labs.check_power_law_fit, no_floor, match="L - L_inf")


def test_compute_optimal_check():
    def good(C, A=406.4, a=0.34, B=410.7, b=0.28):
        G = (a * A / (b * B)) ** (1 / (a + b))
        return G * (C / 6) ** (b / (a + b)), (C / 6) ** (a / (a + b)) / G

    def swapped(C, A=406.4, a=0.34, B=410.7, b=0.28):
        G = (a * A / (b * B)) ** (1 / (a + b))
        return G * (C / 6) ** (a / (a + b)), (C / 6) ** (b / (a + b)) / G

    md.labs.check_compute_optimal(good)
    _rejects(md.labs.check_compute_optimal, swapped)
    _rejects(md.labs.check_compute_optimal, lambda C: ((C / 120) ** 0.5, 20 * (C / 120) ** 0.5),
             match="not at the optimum")


def test_noise_scale_check():
    def good(bs, ss, bb, sb):
        tr = (ss - sb) / (1 / bs - 1 / bb)
        g2 = sb - tr / bb
        return g2, tr, tr / g2

    md.labs.check_noise_scale(good)
    _rejects(md.labs.check_noise_scale, lambda bs, ss, bb, sb: (sb, ss - sb, (ss - sb) / sb))


# --- lab 06: ring and tree ------------------------------------------------------------------------

def _ring(x, ag_offset=1, blocking=False):
    import numpy as np

    r, p = md.dist.get_rank(), md.dist.get_world_size()
    chunks = np.array_split(x, p)
    right, left = (r + 1) % p, (r - 1) % p

    def step(send_chunk, recv_into):
        if blocking:  # correct, deadlock-free, but the two transfers of a step serialise
            if r % 2 == 0:
                md.dist.send(send_chunk, right)
                md.dist.recv(recv_into, left)
            else:
                md.dist.recv(recv_into, left)
                md.dist.send(send_chunk, right)
        else:
            w = md.dist.isend(send_chunk, right)
            md.dist.recv(recv_into, left)
            w.wait()

    for k in range(p - 1):
        buf = np.empty_like(chunks[(r - k - 1) % p])
        step(chunks[(r - k) % p], buf)
        chunks[(r - k - 1) % p] += buf
    for k in range(p - 1):
        step(chunks[(r - k + ag_offset) % p], chunks[(r - k + ag_offset - 1) % p])


def _ring_good(x):
    _ring(x)


def _ring_wrong_allgather(x):
    _ring(x, ag_offset=0)


def _ring_blocking(x):
    _ring(x, blocking=True)


def _ring_deadlock(x):
    r, p = md.dist.get_rank(), md.dist.get_world_size()
    md.dist.send(x, (r + 1) % p)
    md.dist.recv(x, (r - 1) % p)


def _ring_whole_buffer(x):
    """Correct, but sends the whole buffer p - 1 times instead of chunks (a naive ring)."""
    import numpy as np

    r, p = md.dist.get_rank(), md.dist.get_world_size()
    total, current = x.copy(), x.copy()
    for _ in range(p - 1):
        incoming = np.empty_like(x)
        w = md.dist.isend(current, (r + 1) % p)
        md.dist.recv(incoming, (r - 1) % p)
        w.wait()
        total += incoming
        current = incoming
    x[...] = total


def _ring_accumulates_into_sent_chunk(x):
    """The reduce-scatter adds what arrives into the chunk it just sent, not the one it sends next."""
    import numpy as np

    r, p = md.dist.get_rank(), md.dist.get_world_size()
    chunks = np.array_split(x, p)
    right, left = (r + 1) % p, (r - 1) % p
    for k in range(p - 1):
        buf = np.empty_like(chunks[(r - k - 1) % p])
        w = md.dist.isend(chunks[(r - k) % p], right)
        md.dist.recv(buf, left)
        w.wait()
        chunks[(r - k) % p] += buf  # the mistake (the first case, p = 2 with n = 8, has equal chunks)
    for k in range(p - 1):
        w = md.dist.isend(chunks[(r - k + 1) % p], right)
        md.dist.recv(chunks[(r - k) % p], left)
        w.wait()


def test_ring_all_reduce_check():
    md.labs.check_ring_all_reduce(_ring_good)
    with pytest.raises(CheckFailed) as bulk:
        md.labs.check_ring_all_reduce(_ring_whole_buffer)
    assert "whole buffer" in str(bulk.value) and "serialises" not in str(bulk.value)
    with pytest.raises(CheckFailed) as rs:
        md.labs.check_ring_all_reduce(_ring_accumulates_into_sent_chunk)
    assert "the reduce-scatter left rank" in str(rs.value) and "(r - k - 1) mod p" in str(rs.value)
    _rejects(md.labs.check_ring_all_reduce, _ring_wrong_allgather, match="first departure from the ring schedule")
    _rejects(md.labs.check_ring_all_reduce, _ring_blocking, match="correct but slow")
    _rejects(md.labs.check_ring_all_reduce, _ring_deadlock, match="deadlock")


def test_ring_tree_formula_checks():
    import math

    def ring(n, p, a, b):
        return 2 * (p - 1) * a + 2 * (p - 1) / p * n / b

    def tree(n, p, a, b):
        return 2 * math.log2(p) * (a + n / b)

    md.labs.check_collective_times(ring, tree)
    _rejects(md.labs.check_collective_times, lambda n, p, a, b: (p - 1) * a + (p - 1) / p * n / b, tree)
    _rejects(md.labs.check_collective_times, ring, lambda n, p, a, b: math.log2(p) * (a + n / b))

    def cross(p, a, b):
        lg = math.log2(p)
        return 2 * a * b * (p - 1 - lg) / (2 * lg - 2 * (p - 1) / p)

    md.labs.check_ring_tree_crossover(cross)
    _rejects(md.labs.check_ring_tree_crossover, lambda p, a, b: a * b)


# --- lab 07: topology-aware collectives -----------------------------------------------------------

def _hier(x, G, inter_phase=True, algorithm="ring", inter_ranks=None):
    import numpy as np

    r, p = md.dist.get_rank(), md.dist.get_world_size()
    node, local = divmod(r, G)
    intra = md.dist.new_group(range(node * G, node * G + G))
    inter = md.dist.new_group(range(local, p, G) if inter_ranks is None else inter_ranks)
    shard = np.empty(x.size // G, x.dtype)
    md.dist.reduce_scatter_tensor(shard, x, group=intra, algorithm=algorithm)
    if inter_phase:
        md.dist.all_reduce(shard, group=inter, algorithm="ring")
    md.dist.all_gather_into_tensor(x, shard, group=intra, algorithm=algorithm)


def _hier_good(x, G):
    _hier(x, G)


def _hier_no_inter(x, G):
    _hier(x, G, inter_phase=False)


def _flat(x, G):
    md.dist.all_reduce(x, algorithm="ring")


def _hier_world_instead_of_inter(x, G):
    _hier(x, G, inter_ranks=range(md.dist.get_world_size()))  # no inter-node group: the shard goes to everyone


def test_hierarchical_all_reduce_check():
    md.labs.check_hierarchical_all_reduce(_hier_good)
    _rejects(md.labs.check_hierarchical_all_reduce, _hier_world_instead_of_inter,
             match="the inter-node group holds one rank per node")
    _rejects(md.labs.check_hierarchical_all_reduce, _hier_no_inter, match="inter-node all-reduce of the shard")
    _rejects(md.labs.check_hierarchical_all_reduce, _flat, match="flat ring")


def test_two_level_and_contention_checks():
    def flat(n, G, N, a1, b1, a2, b2):
        p = G * N
        return 2 * (p - 1) * a2 + 2 * (p - 1) / p * n / b2

    def hier(n, G, N, a1, b1, a2, b2):
        return 2 * (G - 1) * a1 + 2 * (G - 1) / G * n / b1 + 2 * (N - 1) * a2 + 2 * (N - 1) / N * n / G / b2

    md.labs.check_two_level_times(flat, hier)
    _rejects(md.labs.check_two_level_times, lambda n, G, N, a1, b1, a2, b2: flat(n, G, N, a1, b1, a1, b1), hier)
    _rejects(md.labs.check_two_level_times, flat, lambda n, G, N, a1, b1, a2, b2: hier(n * G, G, N, a1, b1, a2, b2))

    def flows(order, G):
        out = {}
        for a, b in zip(order, order[1:] + order[:1]):
            if a // G != b // G:
                out[a // G] = out.get(a // G, 0) + 1
        return max(out.values(), default=0)

    md.labs.check_flows_per_nic(flows)
    _rejects(md.labs.check_flows_per_nic, lambda order, G: sum(a // G != b // G for a, b in zip(order, order[1:])))
