"""Asynchronous SGD through a parameter server on simulated devices: it never waits for the slowest worker (the
synchronous run takes H_p times longer for the same gradients), its gradients are p - 1 versions stale on average,
and dividing the learning rate by the staleness keeps a large learning rate stable."""

from __future__ import annotations

import numpy as np
import pytest

from minidist.parallel import Logistic, train_async, train_sync

PROBLEM = Logistic()


@pytest.mark.parametrize("p", [2, 4])
def test_async_skips_the_wait_for_the_slowest_and_pays_in_staleness(p):
    updates = 200
    fast = train_async(PROBLEM, p, updates, 0.5)
    sync = train_sync(PROBLEM, p, updates // p, 0.5)
    harmonic = sum(1 / i for i in range(1, p + 1))
    assert sync.time / fast.time == pytest.approx(harmonic, rel=0.1)
    assert np.mean(fast.staleness) == pytest.approx(p - 1, rel=0.1)
    assert fast.staleness[0] == 0 and len(fast.losses) == updates
    assert fast.losses[-1] < 0.8 * PROBLEM.loss(PROBLEM.init())  # it trains


def test_a_straggler_holds_back_sync_not_async():
    slow = {1: 4.0}  # worker 1 takes four times as long
    fast = train_async(PROBLEM, 4, 120, 0.5, slow=slow)
    sync = train_sync(PROBLEM, 4, 30, 0.5, slow=slow)
    assert sync.time > 2 * fast.time


def test_staleness_aware_learning_rate_keeps_a_large_rate_stable():
    aware = train_async(PROBLEM, 8, 200, 8.0)
    plain = train_async(PROBLEM, 8, 200, 8.0, staleness_aware=False)
    assert aware.losses[-1] < plain.losses[-1] and max(plain.losses[-20:]) > 1.5 * max(aware.losses[-20:])


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="workers and updates"):
        train_async(PROBLEM, 0, 10, 0.1)
