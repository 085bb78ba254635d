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


def test_failure_messages_show_numpy_scalars_as_plain_numbers():
    import numpy as np

    from minidist.labs.check import check_cases, fail

    with pytest.raises(CheckFailed) as e:
        fail("mean", np.float64(0.5), (np.float32(0.25), np.int64(3)))
    msg = str(e.value)
    assert "expected: 0.5\n" in msg and "got:      (0.25, 3)" in msg and "np." not in msg
    with pytest.raises(CheckFailed) as e:
        check_cases("half", lambda x: x, [((np.float64(2.0),), 1.0, "halve it")])
    assert "half(2.0,) is wrong" in str(e.value) and "np." not in str(e.value)


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


# --- lab 03: economics and estimation ------------------------------------------------------------

def _run_estimate(params, tokens, batch_tokens, gpus, peak, mfu, usd, flops_per_token=6, use_mfu=True,
                  seconds_per_day=86400, dollar_gpus=None):
    step = flops_per_token * params * batch_tokens / (gpus * peak * (mfu if use_mfu else 1.0))
    seconds = tokens / (batch_tokens / step)
    return step, batch_tokens / step, seconds / seconds_per_day, (dollar_gpus or gpus) * seconds / 3600 * usd


def test_run_estimate_check_says_what_it_computed(capsys):
    import re

    md.labs.check_run_estimate(_run_estimate)
    out = capsys.readouterr().out
    assert out == "ok: run_estimate: step time, throughput, days and dollars follow 6 Psi B / (P F MFU)\n"
    # the check's case (Psi = 30e9) gives 24.7 days and $303,214; the lab's run (Psi = 30.31e9) 24.9 days and
    # $306,366: the check's line must not print numbers that sit next to the lab's and disagree with them
    assert not re.search(r"\d+(\.\d+)? days|\$\d", out)
    psi = 12 * 48 * 7168**2 + 2 * 50_000 * 7168  # the lab's model
    peak = md.hardware.gpu("H100-80GB-SXM").peak("bf16")
    _, _, days, usd = _run_estimate(psi, 600e9, 4 * 2**20, 128, peak, 0.4, 4.0)
    assert f"{days:.1f} days, ${usd:,.0f}" == "24.9 days, $306,366"  # what the lab prints after the check


def test_run_estimate_check_names_the_slip():
    _rejects(md.labs.check_run_estimate, lambda *a: _run_estimate(*a, flops_per_token=2), match="6 Psi FLOPs per token")
    _rejects(md.labs.check_run_estimate, lambda *a: _run_estimate(*a, use_mfu=False), match="divide by the MFU")
    _rejects(md.labs.check_run_estimate, lambda *a: _run_estimate(*a, seconds_per_day=3600), match="that is hours")
    _rejects(md.labs.check_run_estimate, lambda *a: _run_estimate(*a, dollar_gpus=1), match="the cost of one GPU")


# --- lab 04: scaling laws ------------------------------------------------------------------------

def _grid_fit(N, L, points: int):
    """The lab's fit: a least-squares line in log-log space for each L_inf of a grid, the best one kept."""
    import numpy as np

    best = None
    for l_inf in np.linspace(0.0, L.min() - 1e-4, points):
        slope, icpt = np.polyfit(np.log(N), np.log(L - l_inf), 1)
        err = np.sum((np.exp(icpt) / N**-slope + l_inf - L) ** 2)
        if best is None or err < best[0]:
            best = (err, np.exp(icpt), -slope, l_inf)
    return best[1:]


def test_power_law_fit_check():
    import numpy as np

    def no_floor(N, L):
        slope, icpt = np.polyfit(np.log(N), np.log(L), 1)
        return np.exp(icpt), -slope, 0.0

    md.labs.check_power_law_fit(lambda N, L: _grid_fit(N, L, 2000))
    _rejects(md.labs.check_power_law_fit, no_floor, match="L - L_inf")
    # a grid of 20 points comes close but not within the check's tolerance: told to refine it
    _rejects(md.labs.check_power_law_fit, lambda N, L: _grid_fit(N, L, 20), match="scan a finer grid of L_inf")


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

def _ring(x, ag_offset=1, blocking=False, rs_into=1, ag_adds=False, halves=False):
    """A ring all-reduce, right by default; each argument plants one mistake: the all-gather's chunk offset,
    blocking steps, the reduce-scatter adding into chunk (r - k - rs_into), the all-gather adding what it gets,
    every chunk sent in two halves."""
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
            parts = zip(np.array_split(send_chunk, 2), np.array_split(recv_into, 2)) if halves else \
                [(send_chunk, recv_into)]
            for a, b in parts:
                w = md.dist.isend(a, right)
                md.dist.recv(b, left)
                w.wait()

    for k in range(p - 1):
        buf = np.empty_like(chunks[(r - k - 1) % p])
        step(chunks[(r - k) % p], buf)
        chunks[(r - k - rs_into) % p] += buf
    for k in range(p - 1):
        into = chunks[(r - k + ag_offset - 1) % p]
        buf = np.empty_like(into) if ag_adds else into
        step(chunks[(r - k + ag_offset) % p], buf)
        if ag_adds:
            into += buf


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
    _ring(x, rs_into=0)  # on 2 ranks with n = 8 (the first case) the chunks are equal, so this runs


def _ring_accumulates_wrong_from_three_ranks(x):
    """The same mistake, on 3 ranks and more only: it shows inside the reduce-scatter, at its step 1."""
    (_ring_accumulates_into_sent_chunk if md.dist.get_world_size() > 2 else _ring_good)(x)


def _ring_allgather_adds(x):
    """A right reduce-scatter; the all-gather adds what it receives instead of storing it (an all-gather mistake:
    on 2 ranks every message is still the schedule's)."""
    _ring(x, ag_adds=True)


def _ring_not_in_place(x):
    y = x.copy()
    _ring_good(y)
    x = y  # noqa: F841  (the mistake: rebinds the name, the caller's array is unchanged)


def _ring_half_chunks(x):
    """Correct, but every chunk goes in two messages: twice the ring's latency."""
    _ring(x, halves=True)


def _ring_message(fn) -> str:
    with pytest.raises(CheckFailed) as e:
        md.labs.check_ring_all_reduce(fn)
    return str(e.value)


def test_ring_all_reduce_check():
    md.labs.check_ring_all_reduce(_ring_good)
    _rejects(md.labs.check_ring_all_reduce, _ring_deadlock, match="deadlock")


def test_ring_check_whole_buffer_is_told_its_bytes_not_serialisation():
    msg = _ring_message(_ring_whole_buffer)  # a correct ring that isends the whole buffer p - 1 times
    assert "correct but slow" in msg and "on 4 ranks (n = 4096 float64)" in msg
    assert "55.152 us" in msg and "101.304 us" in msg  # the ring's time against the measured one
    assert "3 message(s), 98,304 bytes in all" in msg and "6 chunks of n/p = 1024 elements" in msg
    assert "49,152 bytes in all" in msg and "the whole buffer (32,768 bytes): too many bytes" in msg
    assert "serialises" not in msg


def test_ring_check_blocking_steps_are_told_they_serialise():
    msg = _ring_message(_ring_blocking)  # send then recv: each message counted once, the right size
    assert "correct but slow" in msg and "serialises" in msg
    assert "whole buffer" not in msg and "bytes in all" not in msg


def test_ring_check_extra_messages_are_told_their_latency():
    msg = _ring_message(_ring_half_chunks)
    assert "12 message(s), 49,152 bytes in all" in msg and "every extra message pays the latency" in msg


def test_ring_check_blames_the_reduce_scatter_for_accumulating_into_the_wrong_chunk():
    msg = _ring_message(_ring_accumulates_into_sent_chunk)  # 2 ranks: seen in the first all-gather message
    assert "the reduce-scatter left rank 0 with an incomplete chunk 1" in msg and "(r - k - 1) mod p" in msg
    assert "at all-gather step" not in msg
    msg = _ring_message(_ring_accumulates_wrong_from_three_ranks)  # 3 ranks: seen inside the reduce-scatter
    assert "on 3 ranks with n = 9" in msg and "at reduce-scatter step 1 rank 0 should send chunk 2" in msg
    assert "carry only ranks [0]: the reduce-scatter did not add what it received at step 0" in msg
    assert "(r - k - 1) mod p" in msg and "all-gather" not in msg


def test_ring_check_still_blames_the_all_gather_for_its_own_mistakes():
    msg = _ring_message(_ring_wrong_allgather)  # sends the wrong chunk
    assert "first departure from the ring schedule: at all-gather step 0 rank 0 should send chunk 1" in msg
    assert "reduce-scatter left" not in msg
    msg = _ring_message(_ring_allgather_adds)  # every message right, the stored chunks wrong
    assert "every message followed the ring schedule" in msg and "which it receives in the all-gather" in msg
    assert "do not add" in msg and "reduce-scatter" not in msg


def test_ring_check_names_a_result_not_written_in_place():
    assert "x is unchanged: the result must be written into x in place" in _ring_message(_ring_not_in_place)


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


def _hier_intra_instead_of_inter(x, G):
    node = md.dist.get_rank() // G
    _hier(x, G, inter_ranks=range(node * G, node * G + G))  # the intra-node group passed twice


def test_hierarchical_all_reduce_check():
    md.labs.check_hierarchical_all_reduce(_hier_good)
    _rejects(md.labs.check_hierarchical_all_reduce, _flat, match="flat ring")


def _hier_message(fn) -> str:
    with pytest.raises(CheckFailed) as e:
        md.labs.check_hierarchical_all_reduce(fn)
    return str(e.value)


def test_hierarchical_check_names_the_missing_inter_node_group():
    msg = _hier_message(_hier_no_inter)  # intra-node reduce-scatter and all-gather, nothing across nodes
    assert "hint: each rank holds only its node's sum: the inter-node all-reduce of the shard is missing" in msg
    assert "all-reduce the 1/G shard across nodes; the inter-node group holds one rank per node" in msg
    msg = _hier_message(_hier_world_instead_of_inter)  # no inter-node group: group=None, every rank
    assert "hint: the shards were all-reduced over every rank" in msg
    assert "the inter-node group holds one rank per node" in msg
    msg = _hier_message(_hier_intra_instead_of_inter)  # no inter-node group: the intra-node one again
    assert "hint: the shards were all-reduced inside the node (the intra-node group again)" in msg
    assert "nothing from the other nodes" in msg and "the inter-node group holds one rank per node" in msg


def _hier_returning(x, G):  # the right sum, returned instead of written into x
    y = x.copy()
    _hier_good(y, G)
    return y


def test_hierarchical_check_says_x_is_unchanged_when_the_sum_is_returned():
    assert "hint: x is unchanged: leave the sum in x itself" in _hier_message(_hier_returning)


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


def test_every_check_is_exported_under_its_own_name():
    """Two labs' checks with one name would shadow each other in md.labs: the later import wins, silently."""
    import importlib
    import pkgutil

    import minidist.labs as labs

    seen: dict[str, str] = {}
    for info in pkgutil.iter_modules(labs.__path__):
        if not info.name.endswith("_checks"):
            continue
        module = importlib.import_module(f"minidist.labs.{info.name}")
        for name, obj in vars(module).items():
            if name.startswith("check_") and callable(obj) and obj.__module__ == module.__name__:
                assert name not in seen, f"{name} is defined in both {seen[name]} and {info.name}"
                seen[name] = info.name
                assert getattr(labs, name, None) is obj, f"md.labs.{name} is not {info.name}.{name}"
