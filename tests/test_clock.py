"""The simulated clock: alpha + n/beta per message, one message at a time per link, roofline compute."""

import numpy as np
import pytest

import minidist.dist as dist
from minidist.autograd.cost import charge
from minidist.hardware.clock import Clock
from minidist.hardware.cluster import Cluster
from minidist.runtime import launch

ALPHA, BETA = 3e-6, 2e9
UNIFORM = Cluster.uniform(ALPHA, BETA)


def _send_once(n):
    x = np.zeros(n, np.float32)
    if dist.get_rank() == 0:
        dist.send(x, 1)
    else:
        dist.recv(x, 0)
    return dist.now()


@pytest.mark.parametrize("n", [0, 1, 1000, 300_000])
def test_send_costs_alpha_plus_n_over_beta_exactly(n):
    res = launch(_send_once, 2, args=(n,), cluster=UNIFORM)
    expect = ALPHA + 4 * n / BETA
    assert res[0] == pytest.approx(expect, rel=1e-12) and res[1] == pytest.approx(expect, rel=1e-12)
    assert res.times == [pytest.approx(expect, rel=1e-12)] * 2


def _late_receiver():
    x = np.zeros(1000, np.float64)
    if dist.get_rank() == 0:
        dist.send(x, 1)
        return dist.now()
    dist.compute(seconds=1.0)  # the receiver is busy; the receive completes at max(clock, arrival)
    dist.recv(x, 0)
    return dist.now()


def test_receive_completes_at_max_of_receiver_clock_and_arrival():
    res = launch(_late_receiver, 2, cluster=UNIFORM)
    assert res[0] == pytest.approx(ALPHA + 8000 / BETA)
    assert res[1] == pytest.approx(1.0)


def _contention(n):
    r = dist.get_rank()
    x = np.zeros(n, np.float32)
    if r == 0:  # two messages on the same directed link 0 -> 1: the second waits for the first
        ws = [dist.isend(x, 1, tag=0), dist.isend(x, 1, tag=1)]
        ends = [w.end_time for w in ws]
        for w in ws:
            w.wait()
        return ends
    if r == 2:  # a message 2 -> 1 shares no directed link with them
        dist.send(x, 1, tag=2)
        return dist.now()
    ys = [np.zeros(n, np.float32) for _ in range(3)]
    ws = [dist.irecv(ys[0], 0, tag=0), dist.irecv(ys[1], 0, tag=1), dist.irecv(ys[2], 2, tag=2)]
    for w in ws:
        w.wait()
    return [w.end_time for w in ws]


def test_a_directed_link_carries_one_message_at_a_time():
    n = 10_000
    c = ALPHA + 4 * n / BETA
    res = launch(_contention, 3, args=(n,), cluster=UNIFORM)
    assert res[0] == [pytest.approx(c), pytest.approx(2 * c)]
    assert res[2] == pytest.approx(c)
    assert res[1] == [pytest.approx(c), pytest.approx(2 * c), pytest.approx(c)]


def test_links_follow_the_topology():
    cl = Cluster.dgx_h100(nodes=2)
    assert cl.link(0, 7).name == "NVLink4" and cl.link(7, 8).name == "IB-NDR400"

    def f():
        x = np.zeros(1 << 20, np.uint8)
        if dist.get_rank() == 0:
            dist.send(x, 1)
            dist.send(x, 8)
        elif dist.get_rank() in (1, 8):
            dist.recv(x, 0)
        return dist.now()

    res = launch(f, 9, cluster=cl)
    nv, ib = cl.intra_link, cl.inter_link
    assert res[1] == pytest.approx(nv.alpha + (1 << 20) / nv.beta)
    assert res[8] == pytest.approx(nv.alpha + (1 << 20) / nv.beta + ib.alpha + (1 << 20) / ib.beta)


def test_roofline_compute_charges():
    cl = Cluster.dgx_h100()
    clock = Clock(0, cl)
    g = cl.gpu
    # compute bound: a big matmul in bf16 ... memory bound: an elementwise op
    assert clock.charge_compute("mm", 2e12, 1e6, "bf16") == pytest.approx(2e12 / g.peak_flops["bf16"])
    assert clock.charge_compute("add", 1e6, 3e9, np.float32) == pytest.approx(3e9 / g.hbm_bw)
    assert clock.compute == pytest.approx(2e12 / g.peak_flops["bf16"] + 3e9 / g.hbm_bw)
    # float64 and integer arrays are charged at the fp32 rate; compute_dtype overrides numpy's dtype
    assert clock.roofline(1e12, 0, np.float64) == pytest.approx(1e12 / g.peak_flops["fp32"])
    assert clock.roofline(1e12, 0, np.int64) == pytest.approx(1e12 / g.peak_flops["fp32"])
    bf = Clock(0, Cluster.dgx_h100(compute_dtype="bf16"))
    assert bf.roofline(1e12, 0, np.float64) == pytest.approx(1e12 / g.peak_flops["bf16"])


def _hooked():
    charge("matmul", 1e12, 1e3, np.float32)  # what an autograd op reports
    t1 = dist.now()
    dist.compute(flops=0, bytes=3.35e9, name="stream")
    return t1, dist.now()


def test_autograd_cost_hook_and_explicit_compute_run_on_the_rank_clock():
    cl = Cluster.dgx_h100()
    res = launch(_hooked, 1, cluster=cl)
    t1, t2 = res[0]
    assert t1 == pytest.approx(1e12 / cl.gpu.peak_flops["fp32"])
    assert t2 - t1 == pytest.approx(3.35e9 / cl.gpu.hbm_bw)
    names = [e.name for e in res.trace.filter(stream="compute")]
    assert names == ["matmul", "stream"]


def _tensor_ops():
    import minidist as md

    x = md.tensor(np.ones((64, 32), np.float32), requires_grad=True)
    w = md.tensor(np.ones((32, 16), np.float32), requires_grad=True)
    (x @ w).sum().backward()
    return dist.now()


def test_tensor_ops_are_charged_automatically():
    res = launch(_tensor_ops, 1)
    assert res[0] > 0
    assert any("matmul" in e.name or "@" in e.name for e in res.trace.filter(stream="compute"))


def test_isend_leaves_compute_free_until_wait():
    def f():
        x = np.zeros(250_000, np.float32)  # 1 MB: 0.5 ms on the uniform link
        if dist.get_rank() == 0:
            w = dist.isend(x, 1)
            dist.compute(seconds=2e-4)
            t_before = dist.now()
            w.wait()
            return t_before, dist.now()
        dist.recv(x, 0)
        return dist.now()

    res = launch(f, 2, cluster=UNIFORM)
    c = ALPHA + 1e6 / BETA
    assert res[0] == (pytest.approx(2e-4), pytest.approx(c))
    assert res[1] == pytest.approx(c)


def _overlap(compute_s, async_op, n):
    x = np.ones(n, np.float32)
    w = dist.all_reduce(x, async_op=async_op, algorithm="direct")
    t_issue = dist.now()
    dist.compute(seconds=compute_s, name="backward")
    if w is not None:
        w.wait()
    return t_issue, dist.now(), float(x[0])


@pytest.mark.parametrize("compute_s", [1e-4, 5e-3])
def test_async_all_reduce_beside_compute_costs_the_max_not_the_sum(compute_s):
    n = 250_000  # 1 MB
    c = ALPHA + 4 * n / BETA
    comm = 2 * c  # direct all-reduce on 2 ranks: reduce to rank 0, then broadcast
    sync = launch(_overlap, 2, args=(compute_s, False, n), cluster=UNIFORM)
    over = launch(_overlap, 2, args=(compute_s, True, n), cluster=UNIFORM)
    for r in range(2):
        assert sync[r][1] == pytest.approx(comm + compute_s)
        assert over[r][0] == 0.0  # issuing does not advance the program
        assert over[r][1] == pytest.approx(max(comm, compute_s))
        assert over[r][2] == 2.0
    assert over.times == [pytest.approx(max(comm, compute_s))] * 2


def test_sync_collective_after_async_waits_for_the_comm_stream():
    def f():
        x = np.ones(250_000, np.float32)
        w = dist.all_reduce(x, async_op=True, algorithm="direct")
        dist.all_reduce(x, algorithm="direct")  # same stream: starts after the first one
        t = dist.now()
        w.wait()
        return t

    c = ALPHA + 1e6 / BETA
    assert list(launch(f, 2, cluster=UNIFORM)) == [pytest.approx(4 * c)] * 2
