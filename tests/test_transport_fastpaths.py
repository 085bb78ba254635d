"""The transport's fast paths keep every guarantee of the plain ones.

* Messages larger than a channel are read in place from the sender's memory (cross-memory attach,
  ``minidist/runtime/cma.py``) when the kernel allows it, else streamed through the slots: both give
  the same bytes, reductions, tag matching and refusals.
* Collectives whose every rank hears from every rank skip the board comparison after the data moved;
  a disagreement must still raise on every rank.
* A collective's small exchange step writes and takes its messages straight from the slots
  (``Transport.sendrecv_small``): the same results, simulated times and trace as the queued path.
"""

import os

import numpy as np
import pytest

import minidist.dist as dist
from minidist.runtime import cma, launch
from minidist.runtime.context import current
from minidist.runtime.errors import RankError
from minidist.runtime.shm import default_layout

BIG = 3 * default_layout(2).nslots * default_layout(2).slot_bytes // 8 + 5  # float64s: 3 channels and a bit


def _attach_probe():
    """Whether rank 1 may read rank 0's memory (it probes once rank 0 has sent it something)."""
    x = np.zeros(8, np.uint8)
    if dist.get_rank() == 0:
        dist.send(x, 1)
        dist.recv(x, 1)
        return None
    dist.recv(x, 0)
    dist.send(x, 0)
    return current().transport.cma_in[0] == 1


def _can_attach(method: str | None = None) -> bool:
    return cma.enabled() and launch(_attach_probe, 2, start_method=method)[1]


def _exchange(n, tags):
    """Both ranks send two big messages with different tags and receive them in the other order."""
    r = dist.get_rank()
    dist.barrier()  # a first message from the peer lets each rank probe whether it may read the peer's memory
    xs = [np.arange(n, dtype=np.float64) * (r + 1) + t for t in tags]
    ys = [np.empty(n, np.float64) for _ in tags]
    sends = [dist.isend(x, 1 - r, tag=t) for x, t in zip(xs, tags)]
    for y, t in reversed(list(zip(ys, tags))):
        dist.recv(y, 1 - r, tag=t)
    for w in sends:
        w.wait()
    direct = [op.addr != 0 for w in sends for op in w._ops]
    ok = all(np.array_equal(y, np.arange(n, dtype=np.float64) * (2 - r) + t) for y, t in zip(ys, tags))
    return ok, direct


def _yama_scope() -> str | None:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return f.read().strip()
    except OSError:
        return None


@pytest.mark.skipif(_yama_scope() != "1", reason="only where Yama restricts reads to a process's ancestors")
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_sibling_ranks_may_read_each_other_under_yama_scope_1(method):
    # Ubuntu's default: unless each rank names the launcher as its ptracer, every probe fails
    assert _can_attach(method)


@pytest.mark.parametrize("attach,method", [("on", "fork"), ("on", "spawn"), ("off", "fork")])
def test_big_messages_arrive_whole_with_and_without_attach(monkeypatch, attach, method):
    if attach == "on" and not _can_attach():
        pytest.skip("this system does not let one process read another's memory (process_vm_readv)")
    if attach == "off":
        monkeypatch.setenv("MINIDIST_CMA", "0")
    for ok, direct in launch(_exchange, 2, args=(BIG, (3, 7)), start_method=method):
        assert ok
        assert direct == [attach == "on"] * 2  # the path we asked for was the one taken


def _all_reduce(n, op):
    r = dist.get_rank()
    x = np.arange(n, dtype=np.float64) + r
    dist.all_reduce(x, op=op, algorithm="ring")
    return x


@pytest.mark.parametrize("attach", ["on", "off"])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_ring_all_reduce_of_chunks_larger_than_a_channel(monkeypatch, attach, op):
    if attach == "on" and not _can_attach():
        pytest.skip("process_vm_readv is not allowed here")
    if attach == "off":
        monkeypatch.setenv("MINIDIST_CMA", "0")
    n = 2 * BIG  # two chunks of BIG float64s: the reduce-scatter step reduces through the scratch buffer
    base = np.arange(n, dtype=np.float64)
    want = 2 * base + 1 if op == "sum" else base + 1
    for x in launch(_all_reduce, 2, args=(n, op)):
        np.testing.assert_array_equal(x, want)


def _refused(n):
    r = dist.get_rank()
    dist.barrier()  # probe first, so that the big message takes the in-place path if it can
    if r == 0:
        dist.send(np.zeros(n, np.float64), 1)
    else:
        dist.recv(np.zeros(n + 1, np.float64), 0)


def test_a_big_message_that_does_not_fit_is_refused_on_both_sides():
    with pytest.raises(RankError) as info:
        launch(_refused, 2, args=(BIG,), timeout=20)
    errors = info.value.errors
    assert {errors[r][0] for r in (0, 1)} == {"MismatchError"}
    assert all("does not fit" in errors[r][1] for r in (0, 1)), errors


def _refuse_to_attach(n):
    if dist.get_rank() == 1:
        x = np.empty(n, np.float64)
        dist.recv(x, 0)
        return bool(np.array_equal(x, np.arange(n, dtype=np.float64)))
    w = dist.isend(np.arange(n, dtype=np.float64), 1)
    w.wait()
    return w._ops[0].addr


def test_ranks_that_may_not_attach_send_the_bytes_through_the_slots(monkeypatch):
    # as under a strict ptrace policy: every probe fails, so no channel may use the in-place path
    monkeypatch.setattr(cma, "read", lambda *a: "Operation not permitted")
    assert launch(_refuse_to_attach, 2, args=(BIG,)).values == [0, True]


@pytest.mark.parametrize("coll", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"])
def test_disagreement_raises_on_every_rank_without_the_board_check(coll):
    def f():
        r = dist.get_rank()
        n = 6 if r == 1 else 4
        if coll == "all_reduce":
            dist.all_reduce(np.zeros(n))
        elif coll == "all_gather":
            dist.all_gather_into_tensor(np.zeros(3 * n), np.zeros(n))
        elif coll == "reduce_scatter":
            dist.reduce_scatter_tensor(np.zeros(n), np.zeros(3 * n))
        elif coll == "all_to_all":
            dist.all_to_all_single(np.zeros((3, n)), np.zeros((3, n)))  # rows of n: the signature differs
        elif r == 1:
            dist.all_reduce(np.zeros(n))
        else:
            dist.barrier()

    with pytest.raises(RankError) as info:
        launch(f, 3, timeout=20)
    errors = info.value.errors
    assert set(errors) == {0, 1, 2}
    for r, (name, msg, _) in errors.items():
        assert name == "MismatchError", (r, name, msg)
        assert "rank 1 called" in msg and "(6,)" in msg, msg


_FAST_HITS: list[bool] = []  # filled inside each (forked) rank


def _mixed_collectives(seed: int):
    rng = np.random.default_rng([seed, dist.get_rank()])
    out = []
    for algorithm in ("ring", "recursive_doubling", "halving_doubling", None):
        for n in (1, 7, 256, 70_000):  # 70,000 float64s: larger than a slot, the queued path
            x = rng.standard_normal(n)
            dist.all_reduce(x, algorithm=algorithm)
            out.append(x)
    y = np.empty(4 * dist.get_world_size())
    dist.all_gather_into_tensor(y, rng.standard_normal(4))
    z = np.empty(3 * dist.get_world_size())
    dist.all_to_all_single(z, rng.standard_normal(3 * dist.get_world_size()))
    return out + [y, z, dist.now()], sum(_FAST_HITS)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_small_exchange_fast_path_changes_nothing_but_cpu(monkeypatch, p):
    from minidist.runtime.transport import Transport

    fast = Transport.sendrecv_small

    def counted(self, *args, **kwargs):
        got = fast(self, *args, **kwargs)
        _FAST_HITS.append(got is not None)
        return got

    monkeypatch.setattr(Transport, "sendrecv_small", counted)
    with_fast = launch(_mixed_collectives, p, args=(1,))
    assert all(hits >= 10 for _, hits in with_fast)  # the small steps did take the fast path
    monkeypatch.setattr(Transport, "sendrecv_small", lambda self, *a, **k: None)
    queued = launch(_mixed_collectives, p, args=(1,))
    assert all(hits == 0 for _, hits in queued)
    for (a, _), (b, _) in zip(with_fast, queued):
        assert a[-1] > 0
        for u, v in zip(a, b):
            np.testing.assert_array_equal(u, v)  # bitwise, and the same simulated time
    assert with_fast.times == queued.times
    assert [(e.rank, e.stream, e.name, e.start, e.end) for e in with_fast.trace] == \
        [(e.rank, e.stream, e.name, e.start, e.end) for e in queued.trace]


def _placed(buf: np.ndarray, page_offset: int, nbytes: int) -> np.ndarray:
    """``nbytes`` of ``buf`` starting ``page_offset`` bytes past a page boundary."""
    addr = buf.__array_interface__["data"][0]
    start = (page_offset - addr) % cma.PAGE
    return buf[start : start + nbytes]


@pytest.mark.parametrize("nbytes", [cma.PAGE, 3 * cma.STAGE_BYTES // 2 + 13, 5 * cma.STAGE_BYTES])
@pytest.mark.parametrize("shift", [0, 1, 8, 16, 32, 33, 2048, cma.PAGE - 16])
def test_a_read_is_exact_wherever_source_and_destination_sit(nbytes, shift):
    """A read whose destination lies 1..32 bytes past its source (mod a page) goes through the staging
    buffer (4K aliasing makes the kernel's copy ~5x slower there); either way every byte arrives."""
    if not cma.enabled():
        pytest.skip("process_vm_readv is not available here")
    rng = np.random.default_rng(shift)
    src = _placed(np.empty(nbytes + 2 * cma.PAGE, np.uint8), 512, nbytes)
    src[:] = rng.integers(0, 256, nbytes, dtype=np.uint8)
    dst = _placed(np.zeros(nbytes + 2 * cma.PAGE, np.uint8), 512 + shift, nbytes)
    s, d = src.__array_interface__["data"][0], dst.__array_interface__["data"][0]
    assert cma.aliased(s, d) == (0 < shift <= cma.ALIASED)
    assert cma.read(os.getpid(), s, d, nbytes) is None
    np.testing.assert_array_equal(dst, src)


def _all_to_all_aliased(n):
    """x and y placed so that every block of y sits 16 bytes past the peer's block of x (mod a page), as
    two buffers allocated one after the other by np.empty do; counts the reads that were staged."""
    r, p = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    x = _placed(np.empty((n + 1024) * 4, np.uint8), 512, n * 4).view(np.float32)
    y = _placed(np.empty((n + 1024) * 4, np.uint8), 512 + 16, n * 4).view(np.float32)
    staged, orig, ok = [0], cma._staged, True

    def counting(*a):
        staged[0] += 1
        return orig(*a)

    cma._staged = counting
    try:
        for it in range(30):  # both ranks stage at once, again and again
            x[:] = np.arange(n, dtype=np.float32) + 1000 * r + 10 * it
            dist.all_to_all_single(y, x)
            want = np.concatenate([np.arange(n, dtype=np.float32)[r * (n // p) : (r + 1) * (n // p)] + 1000 * j
                                   for j in range(p)]) + 10 * it
            ok = ok and bool(np.array_equal(y, want))
    finally:
        cma._staged = orig
    return ok, staged[0]


def test_an_all_to_all_between_aliased_buffers_is_staged_and_exact():
    if not _can_attach():
        pytest.skip("process_vm_readv is not allowed here")
    # stage one read here first: forked ranks inherit this process's staging buffer, which must stay private
    # to each of them (an anonymous mmap is shared by default, and two ranks staging at once corrupted data)
    src = _placed(np.arange(3 * cma.PAGE, dtype=np.uint8), 0, 2 * cma.PAGE)
    dst = _placed(np.zeros(3 * cma.PAGE, np.uint8), 16, 2 * cma.PAGE)
    assert cma.read(os.getpid(), src.__array_interface__["data"][0], dst.__array_interface__["data"][0], dst.size) \
        is None and np.array_equal(dst, src) and cma._stage
    n = 2 * (1 << 20)  # float32: 4 MB per rank, 2 MB blocks (read in place)
    for ok, staged in launch(_all_to_all_aliased, 2, args=(n,)):
        assert ok
        assert staged == 30  # the peer's block came through the staging buffer every time
