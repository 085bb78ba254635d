"""Launches of many ranks within the machine's limits: the shared memory they reserve, the files they open,
the processes the system lets them start. Each limit reached says which, and what to do."""

from __future__ import annotations

import errno
import gc
import os
import subprocess
import sys
import textwrap

import multiprocess.process
import numpy as np
import pytest

import minidist.dist as dist
from minidist.runtime import launch, shm
from tests.test_runtime import no_leaks  # noqa: F401  (a fixture)

GiB = 1 << 30


@pytest.mark.parametrize("budget", [4 * GiB, GiB, 256 << 20])
def test_the_channels_fit_the_budget_at_any_world_size(budget):
    for world in (1, 2, 8, 16, 32, 64, 128, 256, 512, 1024):
        try:
            lay = shm.default_layout(world, budget)
        except ValueError as e:
            assert f"{world} ranks as processes" in str(e) and "backend='inprocess'" in str(e)
            smallest = shm.Layout(world, shm.MIN_SLOT_BYTES, shm.MIN_SLOTS)
            assert smallest.size > budget  # refused only when even the smallest channels would not fit
            continue
        assert lay.size <= budget
        assert lay.slot_bytes % 64 == 0 and lay.slot_bytes >= shm.MIN_SLOT_BYTES and lay.nslots >= shm.MIN_SLOTS
        if shm.Layout(world, 512 * 1024, 8).size <= budget:
            assert (lay.slot_bytes, lay.nslots) == (512 * 1024, 8)  # small worlds keep the channels they had
    assert (shm.default_layout(8, 4 * GiB).slot_bytes, shm.default_layout(8, 4 * GiB).nslots) == (512 * 1024, 8)
    assert 0 < shm.segment_budget() <= shm.SEGMENT_BUDGET


def _exchange_everything(sizes):
    """Collectives and messages of every size class: one slot, several, above the in-place limit."""
    r, p = dist.get_rank(), dist.get_world_size()
    out = []
    for n in sizes:
        x = np.arange(n, dtype=np.float64) * (r + 1)
        dist.all_reduce(x)
        out.append(x.copy())
        g = np.empty(n * p)
        dist.all_gather_into_tensor(g, np.full(n, float(r)))
        out.append(g)
        a2a = np.empty(n * p)
        dist.all_to_all_single(a2a, np.arange(n * p, dtype=np.float64) + 1000 * r)
        out.append(a2a)
        y = np.empty(n)
        dist.send(np.full(n, r + 0.5), (r + 1) % p) if r % 2 == 0 else dist.recv(y, (r - 1) % p)
        if r % 2:
            out.append(y)
        dist.recv(y, (r - 1) % p) if r % 2 == 0 else dist.send(np.full(n, r + 0.25), (r + 1) % p)
        if r % 2 == 0:
            out.append(y)
    return out, dist.now()


@pytest.mark.parametrize("cma", ["1", "0"])
def test_the_smallest_channels_compute_and_time_what_the_default_ones_do(monkeypatch, no_leaks, cma):  # noqa: F811
    sizes = [3, 700, 40_000]  # 24 B; 5.6 KB (two 4 KB slots); 320 KB (above the in-place limit of either layout)
    monkeypatch.setenv("MINIDIST_CMA", cma)
    default = launch(_exchange_everything, 4, args=(sizes,))
    monkeypatch.setattr(shm, "SEGMENT_BUDGET", 300 * 1024)
    lay = shm.default_layout(4)
    assert (lay.slot_bytes, lay.nslots) == (shm.MIN_SLOT_BYTES, shm.MIN_SLOTS)
    small = launch(_exchange_everything, 4, args=(sizes,))
    for r in range(4):
        (got, t_small), (want, t_default) = small[r], default[r]
        assert t_small == t_default  # the simulated clock does not see the channels
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    n = sizes[-1]
    largest = small[1][0][-4:]  # the 320 KB calls: all-reduce, all-gather, all-to-all, message
    np.testing.assert_array_equal(largest[0], np.arange(n) * 10.0)  # the sum itself, not only agreement
    np.testing.assert_array_equal(largest[1], np.repeat(np.arange(4.0), n))
    np.testing.assert_array_equal(largest[2], np.arange(4.0).repeat(n) * 1000 + n + np.tile(np.arange(n), 4))
    np.testing.assert_array_equal(largest[3], np.full(n, 0.5))


def test_a_world_too_large_for_the_machine_is_refused_before_any_rank_starts(monkeypatch, no_leaks):  # noqa: F811
    monkeypatch.setattr(shm, "SEGMENT_BUDGET", 100 * 1024)
    with pytest.raises(ValueError, match=r"8 ranks as processes need [\d.,]+ [KMG]B of shared memory.*'inprocess'"):
        launch(dist.get_rank, 8)
    assert list(launch(dist.get_rank, 8, backend="inprocess")) == list(range(8))


def test_a_named_segment_stays_within_the_room_dev_shm_has(monkeypatch):
    """Under spawn the segment lives in /dev/shm, which a container keeps at 64 MB: a page past that room kills the
    rank touching it (SIGBUS), so the channels shrink to fit; under fork the mapping is anonymous and need not."""
    from minidist.runtime.launch import _layout

    monkeypatch.setattr(shm, "named_segment_room", lambda: 64 << 20)
    assert _layout(8, named=True).size <= 0.9 * (64 << 20) < shm.default_layout(8).size == _layout(8, named=False).size
    monkeypatch.setattr(shm, "named_segment_room", lambda: 512 << 10)
    with pytest.raises(ValueError, match=r"need 836 KB .* the limit here is /dev/shm, with 512 KB free .*--shm-size"):
        _layout(8, named=True)
    monkeypatch.setattr(shm, "named_segment_room", lambda: None)  # macOS: no /dev/shm to read
    assert _layout(8, named=True).size == shm.default_layout(8).size


NO_SPARE_SHM = "unshare -m true"  # a private mount namespace, where a small /dev/shm harms nobody


@pytest.mark.skipif(os.geteuid() != 0 or subprocess.run(NO_SPARE_SHM.split(), capture_output=True).returncode != 0,
                    reason="needs root and unshare to mount a small /dev/shm in a private namespace")
def test_spawned_ranks_run_on_a_containers_64_mb_dev_shm(tmp_path):
    """Every pair's slots filled at once (an all-to-all of 16 MB per rank with cross-memory attach off) used to
    touch 224 MB of a 64 MB /dev/shm and die of SIGBUS."""
    script = tmp_path / "small_shm.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, minidist as md
        def f():
            x = np.full(1 << 22, float(md.dist.get_rank()), np.float32)
            y = np.empty_like(x)
            md.dist.all_to_all_single(y, x)
            return float(y[:: 1 << 19].sum())
        print(list(md.launch(f, 8, start_method="spawn", timeout=60)))
    """))
    cmd = f"mount -t tmpfs -o size=64m tmpfs /dev/shm && {sys.executable} {script}"
    out = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "MINIDIST_CMA": "0", "OPENBLAS_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str([float(sum(range(8)))] * 8)


def test_shared_memory_the_system_will_not_reserve_is_named(monkeypatch, no_leaks):  # noqa: F811
    def refuse(size, fork):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(sys.modules["minidist.runtime.launch"], "_Segment", refuse)
    with pytest.raises(OSError, match=r"would not reserve \d+ MB of shared memory for the channels of 4 ranks "
                                      r"\(Cannot allocate memory\).*backend='inprocess'"):
        launch(dist.get_rank, 4)


def test_a_dev_shm_that_refuses_names_says_so_and_the_way_out(monkeypatch, no_leaks):  # noqa: F811
    def refuse(size, fork):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(sys.modules["minidist.runtime.launch"], "_Segment", refuse)
    with pytest.raises(OSError, match=r"ranks started by spawn open the channels by name in POSIX shared memory "
                                      r"\(/dev/shm on Linux\), which refused it here \(Read-only file system\); "
                                      r"start_method='fork'.*backend='inprocess'"):
        launch(dist.get_rank, 2, start_method="spawn")


_LIMITED = textwrap.dedent("""
    import os, resource, sys
    import minidist.dist as dist
    from minidist.runtime import launch
    soft, hard = int(sys.argv[1]), int(sys.argv[2])
    opened = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (opened + soft, opened + hard))
    try:
        print(list(launch(dist.get_rank, 8)))
    except OSError as e:
        print(f"OSError {e.errno}: {e}")
    print("limit", resource.getrlimit(resource.RLIMIT_NOFILE)[0] - opened)
    print("open files after", len(os.listdir("/proc/self/fd")) - opened)
""")


def _limited(soft: int, hard: int) -> str:
    proc = subprocess.run([sys.executable, "-c", _LIMITED, str(soft), str(hard)], capture_output=True, text=True,
                          timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files in /proc")
def test_a_launch_raises_its_open_files_limit_when_it_may():
    out = _limited(20, 4000)  # 8 ranks need about 50 more files than are open
    assert "[0, 1, 2, 3, 4, 5, 6, 7]" in out
    limit = int(out.split("limit ")[1].split()[0])
    assert 50 < limit <= 4000
    assert "open files after 0" in out


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files in /proc")
def test_a_launch_that_may_not_open_its_files_says_so_and_how():
    out = _limited(20, 20)
    assert f"OSError {errno.EMFILE}: " in out
    assert "8 ranks as processes need about" in out and "ulimit -n" in out and "backend='inprocess'" in out
    assert "limit 20" in out and "open files after 0" in out  # refused before anything was opened


def test_a_rank_the_system_will_not_start_is_named_with_the_likely_limit(monkeypatch, no_leaks):  # noqa: F811
    real, started = multiprocess.process.BaseProcess.start, []

    def start(self):
        if len(started) == 2:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        started.append(self)
        return real(self)

    monkeypatch.setattr(multiprocess.process.BaseProcess, "start", start)
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    with pytest.raises(OSError, match=r"would not start rank 2 of 4 .*ulimit -u.*backend='inprocess'") as info:
        launch(dist.get_rank, 4)
    assert info.value.errno == errno.EAGAIN and isinstance(info.value.__cause__, BlockingIOError)
    assert not any(p.is_alive() for p in started)  # the two ranks already started were stopped
    del info, started[:]  # their process objects close their pipes when collected
    gc.collect()
    if fds is not None:
        assert len(os.listdir("/proc/self/fd")) <= fds


@pytest.mark.slow
def test_a_hundred_and_twenty_eight_ranks_as_processes(no_leaks):  # noqa: F811
    def body():
        x = np.full(300, float(dist.get_rank()))
        dist.all_reduce(x)
        return float(x[0])

    assert shm.default_layout(128).slot_bytes < 512 * 1024  # this world runs on smaller channels
    assert list(launch(body, 128, timeout=120)) == [128 * 127 / 2] * 128
