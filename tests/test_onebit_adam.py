"""1-bit Adam: exact momentum averaging equals one device; the compressed all-reduce sends the closed-form bytes
(1/64 of a float64 ring all-reduce, plus scales) and, with error feedback, transmits everything it was given up to
a bounded residual; the toy GPT trains within 5% of uncompressed Adam with frozen variance."""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
from minidist.parallel import OneBitAdam, train_onebit_adam
from minidist.parallel.data.onebit_adam import onebit_all_reduce

CFG = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2)


def test_exact_momentum_averaging_equals_one_device():
    one = train_onebit_adam(CFG, 1, OneBitAdam(warmup=5, compress=False), steps=12, global_batch=8)
    two = train_onebit_adam(CFG, 2, OneBitAdam(warmup=5, compress=False), steps=12, global_batch=8)
    assert max(abs(a - b) for a, b in zip(one.losses, two.losses)) < 1e-12
    assert max(float(np.abs(one.params[k] - two.params[k]).max()) for k in one.params) < 1e-9


@pytest.mark.parametrize("p", [2, 4])
def test_bytes_on_the_wire_are_the_closed_form(p):
    method = OneBitAdam(warmup=3)
    r = train_onebit_adam(CFG, p, method, steps=8, global_batch=8)
    n = sum(v.size for v in r.params.values())
    padded = OneBitAdam.padded(n, p)
    ring = 2 * (p - 1) / p * padded * 8  # one float64 ring all-reduce of the padded gradient per warm-up step
    assert r.bytes_sent == [pytest.approx(3 * ring + 5 * method.payload_bytes(n, p, 8), rel=1e-12)] * p
    assert method.payload_bytes(n, p, 8) < ring / 60  # 1/64 of the bits, plus 2 (p - 1) scales


def _feedback(feedback: bool, steps: int = 200):
    rng = np.random.default_rng([3, md.dist.get_rank()])
    n = 64 * md.dist.get_world_size()
    worker, server = np.zeros(n), np.zeros(n // md.dist.get_world_size())
    drift = []
    total_in, total_out = np.zeros(n), np.zeros(n)
    for _ in range(steps):
        x = rng.standard_normal(n) + 0.3  # a bias the signs alone cannot carry
        mean = x.copy()
        md.dist.all_reduce(mean)
        total_in += mean / md.dist.get_world_size()
        total_out += onebit_all_reduce(x, worker, server, feedback)
        drift.append(float(np.abs(total_out - total_in).max()))
    return drift


def test_error_feedback_keeps_the_running_sum_and_its_absence_does_not():
    with_ef = md.launch(_feedback, 4, args=(True,)).values[0]
    without = md.launch(_feedback, 4, args=(False,)).values[0]
    assert max(with_ef[100:]) < 2 * max(with_ef[:100]) + 1  # bounded: what is dropped is sent later
    assert without[-1] > 2.5 * without[len(without) // 4] and without[-1] > 10 * with_ef[-1]  # grows with the steps


def test_onebit_adam_trains_like_uncompressed_adam():
    exact = train_onebit_adam(CFG, 4, OneBitAdam(warmup=15, compress=False), steps=100, global_batch=16)
    onebit = train_onebit_adam(CFG, 4, OneBitAdam(warmup=15), steps=100, global_batch=16)
    end = [float(np.mean(r.losses[-10:])) for r in (exact, onebit)]
    # No worse than exact Adam by more than 5%. Not "within 5% either way": the sign of a near-zero momentum
    # entry flips with the last bit of a sum, so which run ends lower depends on the CPU's BLAS kernels (seen:
    # 1-bit 8% lower on one machine, 1% higher on another); what the compression must not do is train worse.
    assert end[1] < 1.05 * end[0], end
    assert end[1] < 0.9 * float(np.mean(exact.losses[:5]))  # and it did train


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="warmup"):
        OneBitAdam(warmup=0)
    with pytest.raises(ValueError, match="split evenly"):
        train_onebit_adam(CFG, 3, OneBitAdam(), steps=2, global_batch=8)
