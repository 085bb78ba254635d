"""Mixed precision in md.parallel.train: every layout trains in bf16/fp16/fp8 next to its fp32 run, the ledger
books 2 + 2 + 12 bytes per parameter, and an overflow on any one rank makes every rank skip the step."""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
from minidist.parallel import AdamW, Backend, ParallelConfig, Precision, train
from minidist.parallel.mixed_precision import unscale_and_agree
from minidist.precision import LossScaler

CFG = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2)
LAYOUTS = {"1 device": ParallelConfig(), "dp2 ZeRO-1": ParallelConfig(dp=2, zero_stage=1),
           "dp2 x tp2": ParallelConfig(dp=2, tp=2), "pp2 x2": ParallelConfig(pp=2, microbatches=2),
           "dp2 ZeRO-3": ParallelConfig(dp=2, zero_stage=3)}
QUICK = ("dp2 ZeRO-1", "pp2 x2")  # make test; the others run in make test-slow
RUN = dict(steps=12, global_batch=4, dtype="float32", optimizer=AdamW(lr=3e-3))


@pytest.mark.parametrize("name", [n if n in QUICK else pytest.param(n, marks=pytest.mark.slow) for n in LAYOUTS])
def test_each_layout_trains_in_low_precision_like_fp32_with_2_2_12_bytes(name):
    pc = LAYOUTS[name]
    base = train(CFG, pc, **RUN)
    for precision in ("bf16", "fp16", "fp8"):
        r = train(CFG, pc, precision=Precision(precision), **RUN)
        assert abs(r.losses[-1] / base.losses[-1] - 1) < 0.02, (precision, r.losses[-1], base.losses[-1])
        assert r.losses != base.losses  # the products really were rounded
        assert r.state_bytes == {"params": 2, "grads": 2, "optimizer": 12}
        for mine, ref in zip(r.memory, base.memory):  # float32 AdamW: 4 + 4 + 8 bytes per parameter
            assert mine["params"] == ref["params"] / 2 and mine["grads"] == ref["grads"] / 2
            assert mine["optimizer"] == ref["optimizer"] * 12 / 8
        assert r.skipped_steps == 0 and (r.loss_scales[-1] == 2.0**16 if precision == "fp16" else not r.loss_scales)


def test_a_static_scale_that_always_overflows_skips_every_step_on_every_rank():
    pc = ParallelConfig(dp=2, zero_stage=1)
    frozen = train(CFG, pc, **{**RUN, "optimizer": AdamW(lr=0.0)})
    r = train(CFG, pc, precision=Precision("fp16", loss_scale=2.0**60), **RUN)
    assert r.skipped_steps == RUN["steps"] and r.loss_scales == [2.0**60] * RUN["steps"]
    assert all(np.array_equal(r.params[k], frozen.params[k]) for k in frozen.params)


def _one_rank_overflows():
    rank = md.dist.get_rank()
    g = np.full(4, 2.0**10 * (rank + 1))
    if rank == 1:
        g[2] = np.inf
    scaler = LossScaler(2.0**10)
    ok = unscale_and_agree([(np.zeros(4), g)], scaler)
    return ok, scaler.scale, scaler.skipped, g[0]


def test_ranks_agree_to_skip_when_only_one_rank_overflows():
    out = list(md.launch(_one_rank_overflows, 2))
    assert out == [(False, 2.0**9, 1, 1.0), (False, 2.0**9, 1, 2.0)]  # unscaled, and both skip and back off


def test_bad_precision_arguments_are_named():
    with pytest.raises(ValueError, match="precision must be None or one of"):
        train(CFG, precision=Precision("fp4"))
    with pytest.raises(ValueError, match="loss_scale needs a low precision"):
        train(CFG, precision=Precision(loss_scale=1024.0))
    with pytest.raises(ValueError, match="loss_scale must be None, 'dynamic' or a positive number"):
        train(CFG, precision=Precision("fp16", loss_scale=-1.0))


def test_the_clock_charges_the_formats_bytes_and_peaks_so_fp8_gains_only_where_products_dominate():
    # Every op of the forward and backward moves 2-byte tensors (fp8's products 1-byte operands at fp8's peak),
    # the update of the fp32 master copy keeps fp32: the step predicted from the fp32 run's ops is the one measured.
    gpu = md.Cluster().gpu

    def predict(ops, precision):
        total = 0.0
        for name, flops, nbytes in ops:
            matmul = name.startswith("matmul")
            size, peak = ((4, "fp32") if name == "optimizer.step" else (1, "fp8") if matmul and precision == "fp8"
                          else (2, precision if matmul or precision != "fp8" else "bf16"))
            total += max(flops / gpu.peak(peak), nbytes * size / 4 / gpu.hbm_bw)
        return total

    gains = {}
    for d in (32, 1024):
        cfg = md.GPTConfig(vocab_size=64, seq_len=128, d_model=d, n_layers=1, n_heads=d // 32)
        run = dict(steps=1, global_batch=32, dtype="float32", backend=Backend("inprocess", shape_only=True))
        fp32 = train(cfg, **run)
        ops = [(e.name, e.flops, e.nbytes) for e in fp32.trace.filter(rank=0, stream="compute")]
        times = {p: train(cfg, precision=Precision(p), **run).time[-1] for p in ("bf16", "fp8")}
        for p, t in times.items():
            assert t == pytest.approx(predict(ops, p), rel=1e-9)
        gains[d] = (fp32.time[-1] / times["bf16"], times["bf16"] / times["fp8"])
    assert gains[32][0] > 2.0 and gains[32][1] < 1.2  # memory-bound: the bytes halve, fp8's peak buys little
    assert gains[1024][0] > 5.0 and gains[1024][1] > 1.2 > gains[32][1]  # the products dominate: the peaks show


def test_bf16_gradients_halve_the_data_parallel_traffic():
    cfg = md.GPTConfig(vocab_size=64, seq_len=64, d_model=128, n_layers=1, n_heads=4)
    run = dict(steps=1, global_batch=8, dtype="float32", backend=Backend("inprocess", shape_only=True))
    sent = {p: train(cfg, ParallelConfig(dp=2), precision=Precision(p), **run).comm_bytes[-1]
            for p in (None, "bf16", "fp8")}
    assert sent["bf16"] == sent["fp8"] == [b / 2 for b in sent[None]]
    half = train(md.GPTConfig(**{**vars(cfg), "dtype": "float16"}), ParallelConfig(dp=2), precision=Precision("bf16"),
                 **{**run, "dtype": "float16"}).comm_bytes[-1]
    assert half == sent["bf16"]  # a 2-byte working dtype already sends 2 bytes a number: nothing to scale
