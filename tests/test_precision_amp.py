"""Mixed precision on the autograd: autocast rounds exactly the matrix products (forward and gradients), fp16
loses small gradients without loss scaling and keeps them with it, dynamic scaling skips overflowing steps, and
bf16 / scaled fp8 training of a toy GPT stays with fp32's loss."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import minidist as md
from minidist.autograd.autocast import matmul_rounding
from minidist.precision import LossScaler, autocast, cast, scaled_cast

CFG = md.GPTConfig(vocab_size=32, seq_len=16, d_model=32, n_layers=2, n_heads=4, dtype="float32")
TOKENS = md.data.load_tokens(20_000)[0] % 32


def _representable(a, fmt) -> bool:
    a = np.asarray(a)
    return bool(np.array_equal(cast(a, fmt), a))


def test_autocast_rounds_the_products_and_their_gradients_only():
    rng = np.random.default_rng(0)
    x = md.tensor(rng.standard_normal((4, 8)).astype(np.float32), requires_grad=True)
    w = md.tensor(rng.standard_normal((8, 5)).astype(np.float32), requires_grad=True)
    with autocast("bf16"):
        y = x @ w
        z = md.autograd.functional.softmax(y, axis=-1)
        (z * z).sum().backward()
    assert _representable(y.data, "bf16")
    assert _representable(w.grad, "bf16") and _representable(x.grad, "bf16")
    assert not _representable(z.data, "bf16")  # softmax keeps the working precision
    exact = rng.standard_normal((4, 8)).astype(np.float32)
    plain = (md.tensor(exact) @ md.tensor(np.ones((8, 5), np.float32))).data
    assert not _representable(plain, "bf16")  # outside the block nothing is rounded
    assert matmul_rounding() == (None, None)


def test_autocast_is_restored_after_an_error_and_refuses_bad_arguments():
    with pytest.raises(KeyError), autocast("fp16"):
        raise KeyError("a failing forward")
    assert matmul_rounding() == (None, None)
    with pytest.raises(ValueError, match="scaling must be one of"), autocast("fp8_e4m3", scaling="row"):
        pass
    with pytest.raises(ValueError, match="unknown format 'fp6'"), autocast("fp6"):
        pass


def test_scaled_cast_keeps_small_values_that_a_plain_cast_loses():
    a = np.array([1e-4, 3e-4, -2e-4, 5e-4], np.float32)
    assert np.all(cast(a, "fp8_e4m3") == 0)  # below E4M3's smallest subnormal, 2^-9
    for scaling in ("tensor", "block"):
        r = scaled_cast(a, "fp8_e4m3", scaling)
        assert np.all(np.abs(r - a) <= 2.0**-3 * np.abs(a))  # 3 mantissa bits: half an ulp is 1/16 of the value
    blocks = scaled_cast(np.r_[np.full(32, 1e-3), np.full(32, 100.0)].astype(np.float32), "fp8_e4m3", "block")
    assert np.all(blocks[:32] > 0)  # the outlier's block does not flush its neighbour block
    tensor = scaled_cast(np.r_[np.full(32, 1e-3), np.full(1, 1e4)].astype(np.float32), "fp8_e4m3", "tensor")
    assert np.all(tensor[:32] == 0)  # while one tensor-wide scale set by the outlier does


def _train(fmt=None, scaler=None, steps=60, loss_factor=1.0, **kw):
    """A toy GPT under AdamW (eps tiny: AdamW is then blind to the scale of the loss, so a tiny loss factor
    changes nothing in fp32 and only tests the format's range)."""
    model = md.GPT(CFG, seed=0)
    opt = md.optim.AdamW(model.parameters(), lr=3e-3, eps=1e-20)
    losses, zeros, weights, stepped = [], [], [], []
    for x, y in md.data.batches(TOKENS, 8, 16, seed=1, steps=steps):
        with autocast(fmt, **kw) if fmt else contextlib.nullcontext():
            _, loss = model(x, y)
            small = loss * loss_factor
            (scaler.scale_loss(small) if scaler else small).backward()
        losses.append(float(loss.data))
        g = np.concatenate([np.asarray(p.grad).ravel() for p in model.parameters() if p.grad is not None])
        zeros.append(float(np.mean(g == 0)))
        before = model.lm_head.weight.data.copy()
        stepped.append(scaler.step(opt) if scaler else opt.step() or True)
        weights.append(not np.array_equal(before, model.lm_head.weight.data))
        opt.zero_grad()
    assert weights == stepped  # a skipped step leaves the weights alone, any other moves them
    return np.mean(losses[-10:]), zeros, stepped


@pytest.fixture(scope="module")
def fp32_tiny():
    return _train(loss_factor=2.0**-20)


def test_fp16_without_loss_scaling_loses_small_gradients_and_scaling_recovers_them(fp32_tiny):
    base, zeros32, _ = fp32_tiny
    lost, zeros16, _ = _train("fp16", loss_factor=2.0**-20)
    assert np.mean(zeros32) < 0.05 and min(zeros16) == 1.0  # every gradient flushed to zero: nothing learns
    assert lost > base * 1.5
    scaler = LossScaler(2.0**16, growth_interval=20)
    kept, zeros, _ = _train("fp16", scaler, loss_factor=2.0**-20)
    assert abs(kept / base - 1) < 0.02 and np.mean(zeros) < 0.05
    assert scaler.skipped == 0 and scaler.scale == 2.0**16 * 2**3  # grew after every 20 clean steps


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflowing steps compute with inf on purpose
def test_dynamic_scaling_backs_off_and_skips_overflowing_steps(fp32_tiny):
    base = fp32_tiny[0]
    scaler = LossScaler(2.0**50, growth_interval=1000)
    loss, _, stepped = _train("fp16", scaler, loss_factor=2.0**-20)
    assert not stepped[0] and scaler.skipped == stepped.count(False) > 0
    for before, after, ok in zip(scaler.history, scaler.history[1:], stepped):
        assert after == (before if ok else before / 2)  # halved at every skip, else kept (no growth here)
    assert loss < base * 1.1  # it trains; a little behind fp32, which made every update the skips lost
    static = LossScaler(2.0**50, dynamic=False)
    _train("fp16", static, steps=3, loss_factor=2.0**-20)
    assert static.skipped == 3 and static.scale == 2.0**50  # static: skips forever, never adapts


@pytest.mark.parametrize("kw", [dict(fmt="bf16"), pytest.param(dict(fmt="fp8_e4m3", grad_format="fp8_e5m2",
                                                                     scaling="tensor"), marks=pytest.mark.slow)],
                         ids=["bf16", "fp8 per-tensor"])
def test_low_precision_training_stays_within_2_percent_of_fp32(kw):
    base = _train(steps=100)[0]
    assert abs(_train(steps=100, **kw)[0] / base - 1) < 0.02


@pytest.mark.slow
def test_fp8_gradients_in_e4m3_without_scaling_do_not_train():
    base = _train(steps=100)[0]
    assert _train("fp8_e4m3", steps=100)[0] > base * 1.3  # E4M3's range is too narrow for gradients


def test_loss_scaler_arguments_are_checked():
    for kw, msg in [(dict(init_scale=0), "init_scale"), (dict(init_scale=float("inf")), "init_scale"),
                    (dict(backoff_factor=1.0), "backoff_factor"), (dict(growth_interval=0), "growth_interval")]:
        with pytest.raises(ValueError, match=msg):
            LossScaler(**kw)
