"""The MPI backend: the same rank code under mpiexec gives the simulator's results, bitwise.

Every collective x algorithm x dtype runs on 4 and 8 MPI processes, checked inside the ranks against
numpy (the suite of test_collectives_correctness) and compared bitwise, with the simulated times, with
the same run on the shared-memory simulator; MPI's own collectives (``algorithm="native"``) agree with
numpy to rounding; a script under ``mpiexec`` that calls ``md.dist.init(backend="mpi")`` works; training
dp 2 x tp 2 gives the simulator's losses and weights bitwise; failures end quickly, named, with nothing left.
Skipped, with the reason, where mpi4py or mpiexec is missing (``pip install -e '.[mpi]'``).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import minidist as md
import minidist.dist as dist
from minidist.collectives import ALGORITHMS
from minidist.hardware.cluster import Cluster
from minidist.parallel import Resilience
from minidist.runtime import RankError, ReduceOp, launch
from minidist.runtime.mpi_launch import mpi_available, mpiexec_path, recorded_segments
from tests.test_collectives_correctness import _world, data, reference

pytestmark = pytest.mark.skipif(mpi_available() is not None, reason=f"MPI backend unavailable: {mpi_available()}")
ROOT = Path(__file__).resolve().parents[1]


def _as_in_a_terminal() -> None:
    """In the script's process, before it starts: SIGINT delivered as a terminal delivers it. A test run started
    with SIGINT ignored (``make test &`` from a script, as some CI runners start it) would pass the ignored
    disposition on, and minidist rightly leaves an ignored SIGINT alone: the interrupt tests would then test
    nothing but the inheritance."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _outputs(alg_filter=None) -> dict:
    """Inside a rank: every collective x algorithm x dtype on fixed data; every output and the clock after it."""
    me, p = dist.get_rank(), dist.get_world_size()
    out = {}
    for dtype in (np.float64, np.float32, np.int64):
        name = np.dtype(dtype).name
        for alg in sorted(ALGORITHMS["all_reduce"]):
            for op in (ReduceOp.SUM, ReduceOp.MAX):
                x = data(me, 1, (37,), dtype)
                dist.all_reduce(x, op=op, algorithm=alg)
                out[f"all_reduce/{alg}/{op.name}/{name}"] = (x, dist.now())
        for alg in sorted(ALGORITHMS["broadcast"]):
            x = data(me, 2, (11,), dtype)
            dist.broadcast(x, src=p - 1, algorithm=alg)
            out[f"broadcast/{alg}/{name}"] = (x, dist.now())
        for alg in sorted(ALGORITHMS["reduce"]):
            x = data(me, 3, (13,), dtype)
            dist.reduce(x, dst=1, algorithm=alg)
            out[f"reduce/{alg}/{name}"] = (x, dist.now())
        for alg in sorted(ALGORITHMS["all_gather"]):
            got = [np.zeros(5, dtype) for _ in range(p)]
            dist.all_gather(got, data(me, 4, (5,), dtype), algorithm=alg)
            out[f"all_gather/{alg}/{name}"] = (np.concatenate(got), dist.now())
        for alg in sorted(ALGORITHMS["reduce_scatter"]):
            got = np.zeros(3, dtype)
            dist.reduce_scatter_tensor(got, data(me, 5, (3 * p,), dtype), algorithm=alg)
            out[f"reduce_scatter/{alg}/{name}"] = (got, dist.now())
        for alg in sorted(ALGORITHMS["all_to_all"]):
            got = np.zeros((2 * p, 3), dtype)
            dist.all_to_all_single(got, data(me, 6, (2 * p, 3), dtype), algorithm=alg)
            out[f"all_to_all/{alg}/{name}"] = (got, dist.now())
        for alg in sorted(ALGORITHMS["scatter"]):
            got = np.zeros(4, dtype)
            dist.scatter(got, [data(r, 7, (4,), dtype) for r in range(p)] if me == 0 else None, src=0, algorithm=alg)
            out[f"scatter/{alg}/{name}"] = (got, dist.now())
        for alg in sorted(ALGORITHMS["gather"]):
            got = [np.zeros(4, dtype) for _ in range(p)] if me == 2 else None
            dist.gather(data(me, 8, (4,), dtype), got, dst=2, algorithm=alg)
            out[f"gather/{alg}/{name}"] = (np.concatenate(got) if got else np.zeros(0), dist.now())
    buf = np.arange(6, dtype=np.float64) * (me + 1)
    if me % 2 == 0:  # point to point, tags out of order: the second is set aside until asked for
        dist.send(buf, me + 1, tag=1)
        dist.send(buf * 2, me + 1, tag=2)
    else:
        second, first = np.zeros(6), np.zeros(6)
        dist.recv(second, me - 1, tag=2)
        dist.recv(first, me - 1, tag=1)
        buf = np.concatenate([first, second])
    out["p2p"] = (buf, dist.now())
    return out


@pytest.mark.parametrize("p", [4, pytest.param(8, marks=pytest.mark.slow)])
def test_every_collective_algorithm_and_dtype_is_bitwise_the_simulator(p):
    cluster = Cluster(gpus_per_node=p // 2)  # two nodes: the hierarchical all-reduce crosses them
    sim = launch(_outputs, p, cluster=cluster, timeout=60)
    mpi = launch(_outputs, p, cluster=cluster, timeout=60, backend="mpi")
    assert mpi.wall is not None and mpi.wall > 0
    assert len(sim[0]) > 90
    for r in range(p):
        assert sim[r].keys() == mpi[r].keys()
        for key, (want, t) in sim[r].items():
            got, t_mpi = mpi[r][key]
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), f"{key} on rank {r}"
            assert t_mpi == t, f"{key} on rank {r}: simulated time {t_mpi} under MPI, {t} simulated"
    assert mpi.times == sim.times


@pytest.mark.parametrize("p", [4, pytest.param(8, marks=pytest.mark.slow)])
def test_every_algorithm_matches_numpy_under_mpi(p):
    res = launch(_world, p, args=(p,), cluster=Cluster(gpus_per_node=4 if p == 8 else 2), timeout=120,
                 backend="mpi")
    assert min(res) > 500  # checks made inside each rank, each against numpy


def _native(group_ranks=None) -> int:
    """Inside a rank: every collective with MPI's own implementation, against numpy."""
    me = dist.get_rank()
    group = None if group_ranks is None else dist.new_group(group_ranks)
    ranks = list(range(dist.get_world_size())) if group is None else list(group.ranks)
    p, i = len(ranks), ranks.index(me)
    checks = 0
    for dtype in (np.float64, np.float32, np.int64):
        tol = {"rtol": 1e-5, "atol": 1e-5 * p} if dtype is np.float32 else {"rtol": 1e-12, "atol": 1e-12 * p}
        for op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN):
            if op is ReduceOp.AVG and dtype is np.int64:
                continue
            xs = [data(r, 11, (9,), dtype, op) for r in ranks]
            x = xs[i].copy()
            dist.all_reduce(x, op=op, group=group, algorithm="native")
            np.testing.assert_allclose(x, reference(op, xs), **tol)
            y = xs[i].copy()
            dist.reduce(y, dst=ranks[-1], op=op, group=group, algorithm="native")
            if i == p - 1:
                np.testing.assert_allclose(y, reference(op, xs), **tol)
            full = [data(r, 12, (2 * p,), dtype, op) for r in ranks]
            rs = np.zeros(2, dtype)
            dist.reduce_scatter_tensor(rs, full[i], op=op, group=group, algorithm="native")
            np.testing.assert_allclose(rs, reference(op, full)[2 * i : 2 * i + 2], **tol)
            checks += 3
        b = data(me, 13, (7,), dtype)
        dist.broadcast(b, src=ranks[0], group=group, algorithm="native")
        np.testing.assert_array_equal(b, data(ranks[0], 13, (7,), dtype))
        got = [np.zeros(3, dtype) for _ in range(p)]
        dist.all_gather(got, data(me, 14, (3,), dtype), group=group, algorithm="native")
        np.testing.assert_array_equal(np.concatenate(got), np.concatenate([data(r, 14, (3,), dtype) for r in ranks]))
        g = [np.zeros(3, dtype) for _ in range(p)] if i == 1 else None
        dist.gather(data(me, 15, (3,), dtype), g, dst=ranks[1], group=group, algorithm="native")
        if i == 1:
            np.testing.assert_array_equal(np.concatenate(g), np.concatenate([data(r, 15, (3,), dtype) for r in ranks]))
        s = np.zeros(3, dtype)
        dist.scatter(s, [data(r, 16, (3,), dtype) for r in ranks] if i == 0 else None, src=ranks[0], group=group,
                     algorithm="native")
        np.testing.assert_array_equal(s, data(me, 16, (3,), dtype))
        split = [[(a + 2 * b) % 3 for b in range(p)] for a in range(p)]  # rows a sends to b, uneven
        sent = [np.split(data(ranks[a], 17, (sum(split[a]), 2), dtype), np.cumsum(split[a])[:-1]) for a in range(p)]
        a2a = np.zeros((sum(split[a][i] for a in range(p)), 2), dtype)
        dist.all_to_all_single(a2a, np.concatenate(sent[i]), [split[a][i] for a in range(p)], split[i], group=group,
                               algorithm="native")
        np.testing.assert_array_equal(a2a, np.concatenate([sent[a][i] for a in range(p)]))
        dist.barrier(group=group, algorithm="native")
        checks += 6
    return checks


def _native_world() -> int:
    n = _native()
    odd = [r for r in range(dist.get_world_size()) if r % 2]
    if dist.get_rank() in odd:  # a sub-communicator whose ranks differ from the world's
        n += _native(odd)
    return n


@pytest.mark.parametrize("p", [4, pytest.param(8, marks=pytest.mark.slow)])
def test_native_collectives_agree_with_numpy(p):
    res = launch(_native_world, p, timeout=60, backend="mpi")
    assert min(res) >= 3 * 14 + 18


def test_native_needs_mpi_and_says_so():
    def fn():
        dist.all_reduce(np.ones(2), algorithm="native")

    with pytest.raises(RankError, match="needs the MPI backend"):
        launch(fn, 2)


SCRIPT = """
import sys
import numpy as np
import minidist as md

rank = md.dist.init(backend="mpi")
mesh = md.dist.init_device_mesh((2, 2), ("dp", "tp"))
x = np.arange(5, dtype=np.float64) * (rank + 1)
md.dist.all_reduce(x, group=mesh.get_group("dp"))
y = np.full(3, float(rank))
md.dist.all_reduce(y, group=mesh.get_group("tp"), algorithm="native")
np.save(f"{sys.argv[1]}/{rank}.npy", np.concatenate([x, y, [md.dist.now()]]))
md.dist.destroy_process_group()
"""


def _script_body() -> np.ndarray:
    rank = dist.get_rank()
    mesh = dist.init_device_mesh((2, 2), ("dp", "tp"))
    x = np.arange(5, dtype=np.float64) * (rank + 1)
    dist.all_reduce(x, group=mesh.get_group("dp"))
    return x, dist.now()


def test_a_script_under_mpiexec_joins_with_init(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([mpiexec_path(), "-n", "4", sys.executable, str(script), str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    sim = launch(_script_body, 4)
    for r in range(4):
        got = np.load(tmp_path / f"{r}.npy")
        want_x, _ = sim[r]
        assert got[:5].tobytes() == want_x.tobytes()
        tp_peers = [q for q in range(4) if q // 2 == r // 2]
        np.testing.assert_array_equal(got[5:8], float(sum(tp_peers)))
        assert got[8] > 0  # the simulated clock ran


def test_training_dp2_tp2_is_bitwise_the_simulator():
    cfg = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2)
    pc = md.parallel.ParallelConfig(dp=2, tp=2)
    sim = md.parallel.train(cfg, pc, steps=3, global_batch=4)
    mpi = md.parallel.train(cfg, pc, steps=3, global_batch=4, backend="mpi")
    assert mpi.losses == sim.losses
    assert mpi.time == sim.time and mpi.peak_memory == sim.peak_memory
    for k in sim.params:
        assert mpi.params[k].tobytes() == sim.params[k].tobytes(), k
        assert mpi.grads[k].tobytes() == sim.grads[k].tobytes(), k


def test_training_with_mpis_own_collectives_matches_to_rounding():
    cfg = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2)
    sim = md.parallel.train(cfg, md.parallel.ParallelConfig(dp=2, tp=2), steps=3, global_batch=4)
    native = md.parallel.train(cfg, md.parallel.ParallelConfig(dp=2, tp=2, algorithm="native"), steps=3,
                               global_batch=4, backend="mpi")
    np.testing.assert_allclose(native.losses, sim.losses, rtol=1e-12)
    for k in sim.params:
        np.testing.assert_allclose(native.params[k], sim.params[k], rtol=1e-9, atol=1e-12, err_msg=k)
    with pytest.raises(ValueError, match="needs backend='mpi'"):
        md.parallel.train(cfg, md.parallel.ParallelConfig(dp=2, algorithm="native"), steps=1, global_batch=4)


def _leftovers(launcher: int | None = None) -> tuple[list, list]:
    """The MPI processes and job folders of launches made by ``launcher`` (this process by default) that are
    still there. Jobs of other tests, running beside this one under pytest-xdist, are not counted."""
    launcher = os.getpid() if launcher is None else launcher
    mark = f"MINIDIST_MPI_LAUNCHER={launcher}\0".encode()  # in every process of the job's environment
    procs = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            cmd = open(d + "/cmdline", "rb").read()
            if b"minidist.runtime.mpi_worker" not in cmd or mark not in open(d + "/environ", "rb").read():
                continue
        except OSError:
            continue
        procs.append(cmd.replace(b"\0", b" ").decode(errors="replace"))
    folders = glob.glob(os.path.join(tempfile.gettempdir(), f"minidist-mpi-{launcher}-*"))
    return procs, folders


def test_a_rank_that_raises_stops_the_job_named_with_nothing_left(tmp_path):

    def fn(seen):
        from minidist.runtime.mpi_launch import record_segments

        record_segments(seen, dist.get_rank())  # the MPI library's shared memory, where the test can read it
        dist.barrier()
        if dist.get_rank() == 2:
            raise ValueError("bad shard on rank two")
        x = np.zeros(3)
        dist.all_reduce(x)  # the others wait for rank 2, which never comes

    t = time.monotonic()
    with pytest.raises(RankError, match="rank 2 failed with ValueError: bad shard on rank two") as e:
        launch(fn, 4, args=(str(tmp_path),), timeout=30, backend="mpi")
    assert time.monotonic() - t < 15
    assert "Traceback" in str(e.value)
    assert _leftovers() == ([], [])
    segments = recorded_segments(str(tmp_path))
    assert segments, "the ranks mapped no MPI shared memory: the check below would prove nothing"
    assert [s for s in segments if os.path.exists(s)] == []  # the aborted job's segments are removed


def test_a_job_stopped_before_its_ranks_recorded_their_shared_memory_leaves_none(tmp_path):
    """Ctrl-C during MPI_Init: a rank has mapped its library's shared memory but not yet written it down. The
    launcher finds it in the ranks' maps before it stops them (a swept Ctrl-C left 5 segments in 24 before)."""

    def fn(seen):
        import sys

        from minidist.runtime.mpi_launch import record_segments

        record_segments(seen, dist.get_rank())  # for the test's eyes only
        os.remove(os.path.join(sys.argv[1], f"{dist.get_rank()}.segments"))  # as if stopped before recording
        dist.barrier()
        time.sleep(60)

    with pytest.raises(RankError, match="deadline"):
        launch(fn, 2, args=(str(tmp_path),), timeout=30, backend="mpi", deadline=3)
    assert _leftovers() == ([], [])
    segments = recorded_segments(str(tmp_path))
    assert segments, "the ranks mapped no MPI shared memory: the check below would prove nothing"
    assert [s for s in segments if os.path.exists(s)] == []


def test_disagreeing_ranks_are_named_under_mpi():
    def fn():
        x = np.zeros(4 if dist.get_rank() == 0 else 5)
        dist.all_reduce(x, algorithm="ring")

    with pytest.raises(RankError, match="MismatchError|disagree|does not fit"):
        launch(fn, 2, timeout=30, backend="mpi")


def _native_disagreeing(case: str) -> str | None:
    """Inside a rank: a native collective whose arguments differ between ranks; the error it raised here."""
    from minidist.runtime.errors import MismatchError

    try:
        _disagree_natively(case)
    except MismatchError as e:
        return str(e)
    return None


def _disagree_natively(case: str) -> None:
    r = dist.get_rank()
    if case == "dtype":
        dist.all_reduce(np.ones(10, np.float32 if r == 1 else np.float64), algorithm="native")
    elif case == "length":
        dist.all_reduce(np.ones(11 if r == 0 else 10), algorithm="native")
    elif case == "size":
        dist.all_reduce(np.ones(4 if r == 0 else 2000), algorithm="native")
    elif case == "root":
        dist.broadcast(np.ones(3), src=r % 2, algorithm="native")
    else:  # all-to-all counts: rank 0 sends rank 1 two rows, rank 1 expects one
        dist.all_to_all_single(np.zeros(4), np.ones(4), [2, 2] if r == 0 else [1, 3], [2, 2] if r == 0 else [1, 3],
                               algorithm="native")


@pytest.mark.parametrize("case, p, calls", [
    ("dtype", 3, [r"rank 1 called all_reduce\(shape=\(10,\), dtype=float32, op=SUM, algorithm='native'\) on ranks "
                  r"\[0, 1, 2\]", r"ranks \[0, 2\] called all_reduce\(shape=\(10,\), dtype=float64, op=SUM"]),
    ("length", 2, [r"rank 0 called all_reduce\(shape=\(11,\), dtype=float64, op=SUM",
                   r"rank 1 called all_reduce\(shape=\(10,\), dtype=float64, op=SUM"]),
    ("size", 2, [r"rank 0 called all_reduce\(shape=\(4,\)", r"rank 1 called all_reduce\(shape=\(2000,\)"]),
    ("root", 3, [r"rank 1 called broadcast\(shape=\(3,\), dtype=float64, src=1",
                 r"ranks \[0, 2\] called broadcast\(shape=\(3,\), dtype=float64, src=0"]),
    ("counts", 2, [r"all_to_all_single: message from rank 0 to rank 1 does not fit: rank 0 sent shape \(2,\) "
                   r"dtype float64 \(16 bytes\) but rank 1 receives into shape \(1,\)"]),
])
def test_mpis_own_collectives_refuse_disagreeing_ranks_on_every_rank(case, p, calls):
    """MPI's collectives trust their callers (garbage, partial sums or a timeout): the signatures are compared
    first, and every rank raises MismatchError naming every call and who made it, as the simulator's ranks do
    (its own call last, as the simulator's "rank r called ...; rank me called ...")."""
    t = time.monotonic()
    texts = launch(_native_disagreeing, p, args=(case,), timeout=30, backend="mpi").values
    assert time.monotonic() - t < 15  # not a timeout
    for r, text in enumerate(texts):
        assert text is not None, f"rank {r} did not raise"
        for call in calls:
            assert re.search(call, text), (r, text)
        if case != "counts":
            assert text.startswith("ranks disagree about a collective call: "), text
            own = re.search(rf"(rank {r}|ranks \[[\d, ]*\b{r}\b[\d, ]*\]) called", text)
            assert own and " called " not in text[own.end():], (r, text)


def test_a_wait_that_never_ends_times_out_naming_it():
    def fn():
        if dist.get_rank() == 1:
            dist.recv(np.zeros(2), 0, tag=7)  # rank 0 never sends
        else:
            time.sleep(30)  # busy elsewhere, not finished: only the timeout can tell

    t = time.monotonic()
    with pytest.raises(RankError, match=r"CommTimeoutError: rank 1 waited .* recv\(src=0, tag=7\)"):
        launch(fn, 2, timeout=2, backend="mpi")
    assert time.monotonic() - t < 15
    assert _leftovers()[0] == []


@pytest.mark.parametrize("receiver_left", [True, False])
def test_a_wait_on_a_rank_that_has_finished_ends_at_once_naming_it(receiver_left):
    def fn(receiver_left):
        if dist.get_rank() == 0 and receiver_left:
            dist.send(np.ones(1 << 20), 1, tag=3)  # large enough to wait for its receiver, who has left
        if dist.get_rank() == 1 and not receiver_left:
            dist.recv(np.zeros(4), 0, tag=4)  # rank 0 has left without sending

    t = time.monotonic()
    want = (r"rank 0 waits in send\(dst=1, tag=3\) but rank 1 has finished and will never receive it: rank 1 returned "
            r"from fn without a recv or irecv for it" if receiver_left
            else r"rank 1 waits in recv\(src=0, tag=4\) but rank 0 has finished and will never send it")
    with pytest.raises(RankError, match=rf"PeerExitedError: {want}"):
        launch(fn, 2, args=(receiver_left,), timeout=60, backend="mpi")
    assert time.monotonic() - t < 15  # not the 60 s timeout
    assert _leftovers()[0] == []


def test_a_rank_looping_forever_is_stopped_after_the_timeout():
    def fn():
        if dist.get_rank() == 0:
            while True:
                time.sleep(0.01)

    t = time.monotonic()
    with pytest.raises(RankError, match="DeadlineExceeded"):
        launch(fn, 2, timeout=2, backend="mpi")
    assert time.monotonic() - t < 15
    assert _leftovers()[0] == []


def test_backend_arguments_are_checked():
    with pytest.raises(ValueError, match="backend must be"):
        launch(lambda: None, 2, backend="nccl")
    with pytest.raises(ValueError, match="start_method applies to backend='sim'"):
        launch(lambda: None, 2, backend="mpi", start_method="spawn")
    with pytest.raises(ValueError, match="faults and restarts"):
        md.parallel.train(md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2),
                          resilience=Resilience(restart=True), backend="mpi")


LAUNCHING = """
import time
import minidist as md

def body():
    time.sleep(60)

try:  # the signal may land while "launching" is being printed: that too must raise here
    print("launching", flush=True)
    md.launch(body, 3, backend="mpi")
except KeyboardInterrupt:
    print(time.monotonic(), flush=True)  # the clock is the machine's: the test compares it with its own
    raise
"""


def _launching(tmp_path):
    script = tmp_path / "launching.py"
    script.write_text(LAUNCHING)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            preexec_fn=_as_in_a_terminal)
    assert proc.stdout.readline() == b"launching\n"
    return proc


def _lasting_segments(before: set[str], wait: float = 2.0) -> set[str]:
    """MPI shared-memory files in /dev/shm that were not in ``before`` and are still there after ``wait`` s.

    A running job's segments live for microseconds under a name (UCX unlinks its own once set up), so one that
    lasts is left behind; another test's job beside this one can only add one that it leaked itself."""
    from minidist.runtime.mpi_launch import MPI_SEGMENT_PREFIXES

    def now() -> set[str]:
        return {p for p in glob.glob("/dev/shm/*") if p.startswith(MPI_SEGMENT_PREFIXES)} - before

    end = time.monotonic() + wait
    while now() and time.monotonic() < end:
        time.sleep(0.05)
    return now()


def _gone(launcher: int, deadline: float = 3.0) -> bool:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if _leftovers(launcher)[0] == []:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("delays", [[0.0, 1.0], pytest.param([i * 0.25 for i in range(12)],
                                                             marks=pytest.mark.slow)])
def test_interrupting_an_mpi_launch_stops_every_rank(tmp_path, delays):
    """Ctrl-C (SIGINT) while mpiexec starts or the ranks run: KeyboardInterrupt within 1 s, no rank left."""
    before = _lasting_segments(set(), wait=0)
    for delay in delays:
        proc = _launching(tmp_path)
        time.sleep(delay)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"SIGINT {delay} s into an MPI launch was lost")
        assert b"KeyboardInterrupt" in err, (delay, err[-800:])
        assert float(out) - t0 < 1.0, f"launch raised {float(out) - t0:.2f} s after the interrupt"  # not at exit
        assert _gone(proc.pid), f"ranks left after an interrupt {delay} s in"
        assert _leftovers(proc.pid)[1] == []
        assert _lasting_segments(before) == set(), f"shared memory left after an interrupt {delay} s in"


@pytest.mark.parametrize("delays", [[1.0], pytest.param([i * 0.25 for i in range(12)], marks=pytest.mark.slow)])
def test_a_killed_launcher_takes_its_mpi_ranks_with_it(tmp_path, delays):
    before, killed = _lasting_segments(set(), wait=0), []
    for delay in delays:
        proc = _launching(tmp_path)
        time.sleep(delay)
        proc.kill()
        proc.communicate()
        assert _gone(proc.pid), f"MPI ranks orphaned by a launcher killed {delay} s in"
        assert _lasting_segments(before) == set(), f"shared memory left by a launcher killed {delay} s in"
        killed.append(proc.pid)
    # A launcher killed before mpiexec started a rank leaves its job's folder to the next MPI launch, which removes it.
    assert launch(lambda: 1, 1, backend="mpi").values == [1]
    assert [_leftovers(pid) for pid in killed] == [([], [])] * len(killed)


def test_the_segments_a_rank_leaves_are_found_open_or_mapped():
    """A segment caught between its creation and its unlink (open, not yet mapped) is found as a mapped one is;
    a file of the user's with another name is not, nor one already unlinked."""
    import mmap

    from minidist.runtime.mpi_launch import mpi_segments

    tag = f"{os.getpid()}_{time.monotonic_ns()}"
    held, mapped, users = (f"/dev/shm/ucx_shm_posix_{tag}", f"/dev/shm/mpich_shm_{tag}", f"/dev/shm/mine_{tag}")
    fds = []
    try:
        for path in (held, mapped, users):
            fds.append(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
            os.ftruncate(fds[-1], 4096)
        view = mmap.mmap(fds[1], 4096)
        os.close(fds.pop(1))  # mapped only
        gone = f"/dev/shm/ucx_shm_posix_gone_{tag}"
        fds.append(os.open(gone, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
        os.unlink(gone)  # open, but already unlinked: nothing to remove
        found = {p for p in mpi_segments() if tag in p}
        assert found == {held, mapped}
        assert {p for p in mpi_segments(os.getpid()) if tag in p} == found
        view.close()
    finally:
        for fd in fds:
            os.close(fd)
        for path in (held, mapped, users):
            if os.path.exists(path):
                os.unlink(path)


def test_an_mpi_launch_clears_what_an_abandoned_job_left():
    """The folder and recorded segment of a job whose launcher died go with the next MPI launch; a folder whose
    launcher is alive (this process's own, say) stays."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    tag = f"{os.getpid()}_{time.monotonic_ns()}"
    abandoned = Path(tempfile.gettempdir(), f"minidist-mpi-{dead.pid}-{tag}")
    alive = Path(tempfile.gettempdir(), f"minidist-mpi-{os.getpid()}-{tag}")
    segment = Path(f"/dev/shm/ucx_shm_posix_{tag}")
    try:
        abandoned.mkdir()
        alive.mkdir()
        segment.write_bytes(b"x")
        (abandoned / "0.segments").write_text(str(segment))
        assert launch(lambda: 1, 1, backend="mpi").values == [1]
        assert not abandoned.exists() and not segment.exists()
        assert alive.exists()
    finally:
        for path in (abandoned, alive):
            shutil.rmtree(path, ignore_errors=True)
        segment.unlink(missing_ok=True)


NOTEBOOK_CELL = """
import numpy as np
import minidist as md

SCALE = 3

def body(k):  # a notebook function using a notebook global: it travels by value to the MPI ranks
    x = np.full(k, float(md.dist.get_rank() * SCALE))
    md.dist.all_reduce(x)
    print("sum", x[0])
    return float(x[0])

print(list(md.launch(body, 2, args=(2,), backend="mpi")))
"""


def test_a_notebook_cell_function_runs_under_mpi(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    from minidist.labs.execute import run_notebook

    path = tmp_path / "mpi.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(NOTEBOOK_CELL)]), path)
    outputs = run_notebook(path, timeout=120).cells[0].outputs
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "[rank 0] sum 3.0" in text and "[rank 1] sum 3.0" in text and "[3.0, 3.0]" in text, outputs


def test_torchs_other_calls_run_under_mpi_too():
    """Bitwise ops (MPI's own under 'native'), object collectives, batched point-to-point, objects point to point,
    the monitored barrier, get_backend and destroying the group inside a launch: the same answers as the
    simulator's."""
    def f():
        r, p = dist.get_rank(), dist.get_world_size()
        x, y = np.full(3, r, np.int64), np.full(3, r, np.int64)
        dist.all_reduce(x, op=ReduceOp.BXOR, algorithm="native")
        dist.all_reduce(y, op="bor")
        everyone = [None] * p
        dist.all_gather_object(everyone, {"r": r})
        a, b = np.full(2, float(r)), np.zeros(2)
        ops = [dist.P2POp(dist.isend, a, (r + 1) % p), dist.P2POp(dist.irecv, b, (r - 1) % p)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        got = [None]
        if r == 0:
            dist.send_object_list([("hello", r)], dst=2)
        elif r == 2:
            dist.recv_object_list(got, src=0)
        dist.monitored_barrier(timeout=5)
        backend = dist.get_backend()
        dist.destroy_process_group()
        return x.tolist(), y.tolist(), everyone, b.tolist(), got, backend, dist.is_initialized()

    for r, got in enumerate(launch(f, 3, backend="mpi")):
        assert got == ([3] * 3, [3] * 3, [{"r": 0}, {"r": 1}, {"r": 2}], [float((r - 1) % 3)] * 2,
                       [("hello", 0) if r == 2 else None], "mpi", False)


def _even_here_uneven_there() -> np.ndarray:
    """Rank 0's blocks are all 2 rows (MPI's plain all-to-all would do), rank 1's are not: both must take the same
    MPI call, or MPI matches an all-to-all with an all-to-all-v."""
    r = dist.get_rank()
    splits = [2, 2] if r == 0 else [2, 3]
    x = np.arange(sum(splits), dtype=np.float64) + 10 * r
    out = np.zeros(sum(splits))
    dist.all_to_all_single(out, x, splits, splits, algorithm="native")
    return out


def test_native_all_to_all_with_even_blocks_on_some_ranks_only():
    res = launch(_even_here_uneven_there, 2, timeout=30, backend="mpi")
    np.testing.assert_array_equal(res[0], [0, 1, 10, 11])
    np.testing.assert_array_equal(res[1], [2, 3, 12, 13, 14])
