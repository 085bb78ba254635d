"""The memory ledger: current and peak per category, and an out-of-memory error that explains itself."""

import pytest

import minidist as md
import minidist.dist as dist
from minidist.hardware.memory import CATEGORIES, MemoryLedger, OutOfMemoryError
from minidist.runtime import RankError, launch


def test_current_and_peak_per_category():
    led = MemoryLedger(capacity=100e9)
    led.alloc("params", 10e9)
    led.alloc("grads", 10e9)
    led.alloc("optimizer", 20e9)
    with led.hold("activations", 30e9):
        assert led.total == 70e9
    led.free("grads", 10e9)
    assert led.current == {"params": 10e9, "grads": 0.0, "optimizer": 20e9, "activations": 0.0, "buffers": 0.0}
    assert led.peak["activations"] == 30e9 and led.peak["grads"] == 10e9
    assert led.total == 30e9 and led.peak_total == 70e9
    assert led.peak_breakdown["activations"] == 30e9
    assert set(CATEGORIES) <= set(led.current)
    led.alloc("kv_cache", 1e9)  # other categories are allowed
    assert led.current["kv_cache"] == 1e9
    led.reset_peak()
    assert led.peak_total == led.total


def test_free_more_than_held_is_an_error():
    led = MemoryLedger(1e9)
    led.alloc("buffers", 10)
    with pytest.raises(ValueError, match="only 10 bytes held"):
        led.free("buffers", 11)
    with pytest.raises(ValueError):
        led.alloc("buffers", -1)


def test_out_of_memory_names_categories_and_sizes():
    led = MemoryLedger(capacity=80e9, rank=3)
    led.alloc("params", 30e9)
    led.alloc("optimizer", 40e9)
    with pytest.raises(OutOfMemoryError) as info:
        led.alloc("activations", 20e9)
    msg = str(info.value)
    assert "rank 3" in msg and "'activations'" in msg and "20.000 GB" in msg
    assert "params=30.000 GB" in msg and "optimizer=40.000 GB" in msg and "capacity 80.000 GB" in msg
    assert led.total == 70e9  # a failed allocation holds nothing


def test_ledger_per_rank_with_the_clusters_hbm():
    def f():
        m = dist.memory()
        m.alloc("params", 1e9 * (dist.get_rank() + 1))
        return m.capacity

    res = launch(f, 2, cluster=md.Cluster.dgx_a100())
    assert list(res) == [80e9, 80e9]
    assert [m.current["params"] for m in res.memory] == [1e9, 2e9]


def test_simulated_hbm_overflow_raises_out_of_memory_in_the_caller():
    def f():
        dist.memory().alloc("activations", 2e9)

    with pytest.raises(RankError, match="OutOfMemoryError") as info:
        launch(f, 1, cluster=md.Cluster.dgx_h100(hbm_bytes=1e9))
    assert isinstance(info.value.exc, md.OutOfMemoryError)
