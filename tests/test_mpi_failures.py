"""The MPI backend's failures named as the simulator names them: the rank that died and how, and a launch that ends
within its timeout even when mpiexec itself is stopped.

Skipped, with the reason, where mpi4py or mpiexec is missing (``pip install -e '.[mpi]'``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import minidist.dist as dist
from minidist.runtime import RankError, launch
from minidist.runtime.mpi_launch import mpi_available
from tests.test_mpi_backend import _leftovers

pytestmark = pytest.mark.skipif(mpi_available() is not None, reason=f"MPI backend unavailable: {mpi_available()}")


def _die(how: str) -> None:
    dist.barrier()
    if dist.get_rank() == 2:
        time.sleep(0.2)  # the others are waiting in the all-reduce below when it dies
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(np.zeros(3))


@pytest.mark.parametrize("how, p, text", [("exit", 3, r"exit code 3"), ("kill", 4, r"killed by SIGKILL")])
def test_a_rank_that_dies_without_reporting_is_named_with_how_it_ended(how, p, text):
    t = time.monotonic()
    with pytest.raises(RankError, match=rf"rank 2 failed with RankDied: rank 2 exited without reporting \({text}")\
            as e:
        launch(_die, p, args=(how,), timeout=30, backend="mpi")
    assert time.monotonic() - t < 20  # not the timeout
    assert e.value.rank == 2
    others = {r: e.value.errors[r][0] for r in range(p) if r != 2}
    assert set(others.values()) <= {"Terminated"}, others
    assert _leftovers() == ([], [])


def _stop_mpiexec(launcher: int, stopped: list) -> None:
    """In the test's process: SIGSTOP the launcher's mpiexec as soon as it appears."""
    end = time.monotonic() + 10
    while time.monotonic() < end and not stopped:
        for d in Path("/proc").glob("[0-9]*"):
            try:
                stat = (d / "stat").read_text()
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == launcher and b"mpiexec" in cmd.split(b"\0")[0]:
                os.kill(int(d.name), signal.SIGSTOP)
                stopped.append(int(d.name))
                return
        time.sleep(0.001)


def test_a_stopped_mpiexec_does_not_hold_the_launch_past_its_timeout():
    stopped: list = []
    watcher = threading.Thread(target=_stop_mpiexec, args=(os.getpid(), stopped), daemon=True)
    watcher.start()
    t = time.monotonic()
    with pytest.raises(RankError, match=r"with mpiexec \(pid \d+\) stopped \(SIGSTOP"):
        launch(dist.barrier, 2, timeout=2, backend="mpi")
    watcher.join()
    assert stopped, "mpiexec was never seen: the test proved nothing"
    assert time.monotonic() - t < 15
    assert _leftovers() == ([], [])
