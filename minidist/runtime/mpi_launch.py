"""``md.launch(fn, world_size, backend="mpi")``: the same launch, its ranks started by ``mpiexec``.

The function and its arguments travel by value (``pickling.py``, as under spawn) in a file of a private
folder; ``mpiexec -n world_size python -m minidist.runtime.mpi_worker FOLDER`` runs them, one MPI process
per rank (each through a shell line that records how its process ended, ``RANK_WRAPPER``); each rank leaves
its report (value, simulated time, ledger, trace, output) in the folder, and the result is the same
``LaunchResult`` the simulator returns. The simulated clocks keep running: every message is charged on the
modelled cluster exactly as in shared memory, whatever the real network did;
the wall time of the real run is in ``LaunchResult.wall``.

No hangs and no leftovers: ranks time out inside a wait like simulated ones, a rank that raises aborts
the MPI job, the launcher stops the job (mpiexec, its proxy and every rank) when a rank overstays ``timeout`` after
the first returned or failed, past ``deadline``, when mpiexec itself stays stopped (SIGSTOP) past ``timeout``, or on
Ctrl-C, and the folder is removed whatever happens. A rank that dies without reporting is named, with its exit code
or signal, and the others as stopped after it.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from minidist.hardware.cluster import Cluster
from minidist.hardware.trace import Trace
from minidist.runtime import pickling
from minidist.runtime.errors import exit_text, proc_stat
from minidist.runtime.live import LiveView
from minidist.runtime.results import LaunchResult, failure

POLL = 0.02  # seconds between looks at the ranks' files
# mpiexec starts each rank through this shell line: it runs the rank, then records how its process ended ($?: the
# exit code, or 128 + N for signal N) in FOLDER/<rank>.exit, so that a rank that dies without reporting (os._exit, a
# signal, a crash in C) is named with how it ended, not only as one of the ranks mpiexec took down with it. A rank
# that mpiexec kills takes its shell along (they share a process group), so it records nothing.
RANK_WRAPPER = ('"$@"; s=$?; f="$MINIDIST_MPI_FOLDER/${PMI_RANK:-$OMPI_COMM_WORLD_RANK}.exit"; '
                '[ -e "$MINIDIST_MPI_FOLDER/payload" ] && echo "$s" > "$f.tmp" && mv "$f.tmp" "$f"; exit "$s"')
# What MPI libraries name their node-local shared memory: MPICH, the UCX it may run on (a 64 KB segment left once
# in about 400 interrupted launches here), Open MPI's vader/sm transports.
MPI_SEGMENT_PREFIXES = ("/dev/shm/mpich_shm_", "/dev/shm/ucx_shm_posix_", "/dev/shm/vader_segment",
                        "/dev/shm/sm_segment")


def mpiexec_path() -> str:
    """The ``mpiexec`` next to this Python (the ``mpi`` extra installs MPICH there), else the one on PATH."""
    here = Path(sys.executable).with_name("mpiexec")
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("backend='mpi' needs mpiexec: pip install -e '.[mpi]' (mpi4py and MPICH as packages), "
                           "or put your MPI's mpiexec on PATH")
    return found


def mpi_available() -> str | None:
    """None when the MPI backend can run here, else why not (for tests to skip with)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install -e '.[mpi]')"
    try:
        mpiexec_path()
    except RuntimeError as e:
        return str(e)
    return None


class _Job:
    """The running ``mpiexec`` and the ranks' files in ``folder``."""

    def __init__(self, world: int, folder: str, live: LiveView) -> None:
        self.world, self.folder, self.live = world, folder, live
        self.read = [0] * world  # bytes of each rank's output already shown
        self.reports: dict[int, tuple] = {}
        self.order: list[int] = []

    def look(self) -> None:
        for r in range(self.world):
            out = os.path.join(self.folder, f"{r}.out")
            try:
                with open(out, "rb") as f:
                    f.seek(self.read[r])
                    text = f.read()
            except OSError:
                text = b""
            if text:
                self.read[r] += len(text)
                self.live.output(r, text.decode(errors="replace"))
            try:
                with open(os.path.join(self.folder, f"{r}.progress")) as f:
                    done, total, what = f.read().split(" ", 2)
                self.live.report(r, int(done), int(total), what)
            except (OSError, ValueError):
                pass
            if r not in self.reports:
                path = os.path.join(self.folder, f"{r}.report")
                if os.path.exists(path):
                    with open(path, "rb") as f:
                        self.reports[r] = pickling.loads_report(f.read())
                    self.order.append(r)


def rank_exits(folder: str) -> dict[int, tuple[int, int]]:
    """{rank: (when, exit code as Popen gives it: negative for a signal)} of the ranks whose wrapper recorded an end,
    ``when`` the record's modification time in nanoseconds (the first to die has the smallest)."""
    found = {}
    for f in Path(folder).glob("*.exit"):
        try:
            code = int(f.read_text().strip())
            found[int(f.name.split(".")[0])] = (f.stat().st_mtime_ns, -(code - 128) if code > 128 else code)
        except (OSError, ValueError):
            pass
    return found


def _stop(proc: subprocess.Popen, folder: str, grace: float = 3.0) -> None:
    """Stop mpiexec, its proxy and every rank, and wait until they are gone.

    MPICH's launcher puts its proxy and each rank in a session of their own, so killing mpiexec's process
    group does not reach them, and after an MPI_Abort mpiexec may exit while a rank is still on its way
    out. The job's processes are found by what they carry: the ranks' command lines name this launch's
    private folder, the proxy is mpiexec's child.
    """
    pids = _job_processes(folder, proc.pid)
    # A rank stopped inside MPI_Init has mapped its library's shared memory but not yet recorded it: freeze the
    # job and read what each process maps before the kill (a killed rank cannot remove it, nor can the library).
    _freeze([proc.pid, *pids])
    mapped = set().union(*(mpi_segments(p) for p in pids))
    for pid in [proc.pid, *pids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    end = time.monotonic() + grace
    while pids and time.monotonic() < end:
        time.sleep(0.005)
        pids = [p for p in pids if _running(p)]
    remove_segments(mapped | recorded_segments(folder))


def _freeze(pids: list[int], wait: float = 0.2) -> None:
    """SIGSTOP ``pids``; wait (at most ``wait`` s) until each has stopped or is gone, so what they map stays put."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            pass
    end = time.monotonic() + wait
    while time.monotonic() < end and any(_state(p) not in ("T", "t", "Z", "X", "") for p in pids):
        time.sleep(0.001)


def record_segments(folder: str, rank: int) -> None:
    """Called by each rank once MPI is up: note its library's shared-memory files in the job's folder."""
    Path(folder, f"{rank}.segments").write_text("\n".join(sorted(mpi_segments())))


def recorded_segments(folder: str) -> set[str]:
    found = set()
    for f in Path(folder).glob("*.segments"):
        try:
            found.update(f.read_text().split())
        except OSError:
            pass
    return found


def mpi_segments(pid: int | str = "self") -> set[str]:
    """The MPI library's shared-memory files process ``pid`` (this one by default) has open or mapped.

    A job that ends normally removes them; one stopped (an abort, a timeout, Ctrl-C, a dead launcher)
    leaves them in /dev/shm, a few MB each until the machine restarts, so each rank records them
    (``record_segments``), the launcher looks at its ranks before it stops them, and whoever stops
    the job removes them. Open files count as well as mapped ones: UCX creates a segment, holds it open
    and unlinks it once it has set it up (peers attach through /proc), so one caught between its creation
    and that unlink is in no map yet. Only the library's own names are taken: a rank may map shared memory
    of the user's that must outlive the job."""
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:  # the process is gone, or this is not Linux
        return set()
    paths = []
    for line in lines:
        fields = line.split(None, 5)  # address, perms, offset, device, inode, path (if any)
        paths.append(fields[5].strip() if len(fields) == 6 else "")
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:  # closed meanwhile
            pass
    return {p for p in paths if p.startswith(MPI_SEGMENT_PREFIXES) and not p.endswith("(deleted)")}


def remove_segments(paths) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:  # already removed (by the library, or another rank of the job)
            pass


def _job_processes(folder: str, mpiexec: int) -> list[int]:
    """Every live process whose command line names ``folder``, or whose parent is ``mpiexec`` (Linux /proc)."""
    found = []
    key = folder.encode()
    for d in Path("/proc").glob("[0-9]*"):
        pid = int(d.name)
        if pid in (mpiexec, os.getpid()):
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if key in cmd or ppid == mpiexec:
            found.append(pid)
    return found


def _sweep_abandoned_jobs() -> None:
    """Remove what jobs whose launcher died have left and nobody else will: their folders and recorded segments.

    A launcher killed (SIGKILL, or its kernel restarted) after making its job's folder and before mpiexec started
    a rank leaves the folder with no rank to remove it (ranks that did start remove it themselves). Each MPI
    launch clears such folders, once their launcher is gone and no process names them any more.
    """
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "minidist-mpi-*-*")):
        try:
            launcher = int(os.path.basename(path).split("-")[2])
        except (IndexError, ValueError):
            continue
        if _running(launcher) or _job_processes(path, -1):
            continue
        remove_segments(recorded_segments(path))
        shutil.rmtree(path, ignore_errors=True)


def _state(pid: int) -> str:
    """The state letter of ``pid`` in /proc (R, S, T, Z, ...), or "" if it is gone."""
    fields = proc_stat(pid)
    return fields[0] if fields else ""


def _running(pid: int) -> bool:
    """Whether ``pid`` is alive and not a zombie waiting to be reaped."""
    return _state(pid) not in ("Z", "")


def launch_mpi(fn, world_size: int, args: tuple, kwargs: dict | None, cluster: Cluster | None, timeout: float,
               quiet: bool, deadline: float | None):
    """Run ``fn`` on ``world_size`` MPI processes; the LaunchResult, or the RankError of the first failure."""
    why = mpi_available()
    if why is not None:
        raise RuntimeError(f"md.launch(backend='mpi'): {why}")
    _sweep_abandoned_jobs()
    try:
        payload = pickling.dumps((fn, args, kwargs, cluster, timeout))
    except Exception as e:
        raise TypeError(f"launch: fn and its arguments must be picklable to run under MPI: {type(e).__name__}: {e}") \
            from e
    proc = live = None
    # Named first and made inside the try: a Ctrl-C that lands between a mkdtemp and the try (it did, about once in
    # twenty interrupts on a loaded machine) would leave the folder behind. The pid says whose job it is.
    folder = os.path.join(tempfile.gettempdir(), f"minidist-mpi-{os.getpid()}-{secrets.token_hex(6)}")
    try:
        os.mkdir(folder, 0o700)
        live = LiveView(world_size, quiet)
        job = _Job(world_size, folder, live)
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   MINIDIST_MPI_LAUNCHER=str(os.getpid()), MINIDIST_MPI_FOLDER=folder)
        cmd = [mpiexec_path(), "-n", str(world_size), "/bin/sh", "-c", RANK_WRAPPER, "minidist-rank", sys.executable,
               "-m", "minidist.runtime.mpi_worker", folder]
        t0 = time.monotonic()
        with open(os.path.join(folder, "payload"), "wb") as f:
            f.write(payload)
        log = open(os.path.join(folder, "mpiexec.log"), "wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        log.close()
        first_done = stopped_since = None
        overstayed = None
        while proc.poll() is None:
            time.sleep(POLL)
            job.look()
            now = time.monotonic()
            if job.reports and first_done is None:
                first_done = now
            # mpiexec stopped (SIGSTOP, Ctrl-Z, a debugger) cannot start, abort or end the job: past the timeout the
            # launcher stops it rather than wait for it forever
            stopped_since = (stopped_since or now) if _state(proc.pid) in ("T", "t") else None
            if deadline is not None and now - t0 > deadline:
                overstayed = f"the launch's deadline of {deadline:g} s"
            elif stopped_since is not None and now - stopped_since > timeout:
                overstayed = (f"{timeout:g} s (the timeout) with mpiexec (pid {proc.pid}) stopped (SIGSTOP, Ctrl-Z or "
                              f"a debugger)")
            elif first_done is not None and now - first_done > timeout:
                r = job.order[0]
                how = "returned" if job.reports[r][0] == "ok" else "failed"
                overstayed = f"{timeout:g} s (the timeout) after rank {r} {how}"
            if overstayed:
                break
        _stop(proc, folder)
        job.look()
        exits = rank_exits(folder)
        wall = time.monotonic() - t0
    except BaseException:
        if proc is not None:
            _stop(proc, folder)
        shutil.rmtree(folder, ignore_errors=True)
        if live is not None:
            live.close({})
        raise
    try:
        log_text = Path(folder, "mpiexec.log").read_text(errors="replace")
    except OSError:
        log_text = ""
    shutil.rmtree(folder, ignore_errors=True)
    reps = job.reports
    live.close({r: rep[6] for r, rep in reps.items()})
    errors = {r: rep[2:6] for r, rep in reps.items() if rep[0] == "error"}
    missing = [r for r in range(world_size) if r not in reps]
    if not errors and not missing:
        res = LaunchResult([reps[r][2] for r in range(world_size)], [reps[r][3] for r in range(world_size)],
                           [reps[r][4] for r in range(world_size)],
                           Trace.from_recorders({r: reps[r][5] for r in range(world_size)}),
                           [reps[r][6] for r in range(world_size)])
        res.wall = wall
        return res
    order = [r for r in job.order if r in errors]
    dead = sorted((exits[r][0], r) for r in missing if r in exits and exits[r][1] != 0)
    if dead and not errors and not overstayed:  # the first rank whose process ended without reporting caused it
        first = dead[0][1]
        code = exits[first][1]
        errors[first] = ("RankDied", f"rank {first} exited without reporting ({exit_text(code)})", "", None)
        order.append(first)
        missing.remove(first)
        for r in missing:
            errors[r] = ("Terminated", f"stopped with the MPI job after rank {first} died "
                         f"({exit_text(code, cause=False)})", "", None)
            order.append(r)
    for r in missing:
        if overstayed:
            errors[r] = ("DeadlineExceeded", f"rank {r} ran past {overstayed} and was stopped", "", None)
        elif errors:
            errors[r] = ("Terminated", "stopped with the MPI job after another rank failed", "", None)
        else:
            tail = "\n".join(log_text.strip().splitlines()[-5:])
            errors[r] = ("RankDied", f"rank {r} exited without reporting (mpiexec exit code {proc.returncode}"
                         + (f"; mpiexec said: {tail}" if tail else "") + ")", "", None)
        order.append(r)
    raise failure(errors, order)
