"""Waiting ranks poll briefly, then sleep: a long wait costs no CPU, whether or not ranks outnumber cores.

When ranks outnumber cores the poll yields the core at every look (``sched_yield``); these tests make
sure that choice never turns into a busy wait, with as many cores as ranks and with fewer (the core
count is patched before the fork, so both cases run on any machine).
"""

import time

import numpy as np
import pytest

import minidist.dist as dist
from minidist.runtime import launch, transport


def _late_sender(delay: float) -> float:
    """Rank 0 sends after ``delay`` seconds; the others wait for it. Returns the CPU seconds spent."""
    x = np.zeros(4)
    t0 = time.process_time()
    if dist.get_rank() == 0:
        time.sleep(delay)
        for r in range(1, dist.get_world_size()):
            dist.send(x + r, r)
    else:
        dist.recv(x, 0)
        assert x[0] == dist.get_rank()
    return time.process_time() - t0


@pytest.mark.parametrize("cores", [None, 1], ids=["a core each", "fewer cores than ranks"])
def test_a_rank_that_waits_long_sleeps(monkeypatch, cores):
    if cores is not None:
        monkeypatch.setattr(transport, "_cores", lambda: cores)
    cpu = launch(_late_sender, 3, args=(1.0,), timeout=30)
    # a rank that polled through the second would show about 1 s of CPU; sleeping, it shows almost none
    assert max(cpu[1:]) < 0.25, cpu


def _pause_in_use() -> bool:
    from minidist.runtime.context import current

    return current().transport.pause is not None


def test_the_poll_yields_whether_or_not_ranks_outnumber_cores(monkeypatch):
    """Ranks share a core when they outnumber cores, and also when another program holds one: 2 ranks beside a
    busy process took 140 us a 1 KB all-reduce with plain polls and 17 us with yields (tests/bench/HISTORY.md),
    so the poll yields at every look in both cases."""
    for cores in (4, 1):
        monkeypatch.setattr(transport, "_cores", lambda cores=cores: cores)
        assert list(launch(_pause_in_use, 2)) == [True, True]
