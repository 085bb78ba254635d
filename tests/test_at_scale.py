"""A published run's step on thousands of simulated GPUs (``md.parallel.at_scale``, ``md.viz.at_scale``).

At small scale the step ``simulate_step`` reports is the step of the run with data on one process per rank
(so what it says at 16,384 ranks is what the same code would measure, not a formula); its MFU and TFLOP/s
follow from the step time by their definitions; a model of ``md.estimate`` maps to the GPT it describes. The
LLaMA 3 405B step itself (16,384 ranks, under 60 s and 4 GB on the course machine) is a slow test and a
benchmark (``make bench``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import minidist as md
from minidist.estimate import model
from minidist.parallel import ParallelConfig, Precision
from minidist.parallel.at_scale import gpt_config, simulate_step
from minidist.viz.at_scale import layout_of, published_parallel

LLAMA = md.GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, mlp="swiglu",
                     norm="rmsnorm", bias=False, d_ff=64)


def test_the_simulated_step_is_the_step_of_the_run_with_data():
    pc = ParallelConfig(tp=2, pp=2, dp=2, microbatches=2, sequence_parallel=True, zero_stage=1, recompute="full")
    step = simulate_step(LLAMA, pc, 8)
    with np.errstate(all="ignore"):
        data = md.parallel.train(LLAMA, pc, steps=1, global_batch=8, dtype="float16", precision=Precision("bf16"))
    assert step.step_time == pytest.approx(data.time[0], rel=1e-12)
    assert step.peak_memory == max(data.peak_memory)
    assert (step.gpus, step.simulated_ranks, step.num_params) == (8, 2, data.num_params)
    peak = md.Cluster().gpu.peak("bf16")
    tokens = 8 * LLAMA.seq_len
    assert step.mfu == pytest.approx(6 * data.num_params * tokens / (step.step_time * 8 * peak))
    attention = 12 * LLAMA.seq_len * LLAMA.d_model * LLAMA.n_layers
    assert step.tflops_per_gpu == pytest.approx((6 * data.num_params + attention) * tokens / step.step_time / 8 / 1e12)
    assert 0 < step.compute_time < step.step_time  # a pipeline and tensor parallelism leave the GPUs waiting


def test_a_layout_that_does_not_fit_is_refused_by_the_ledger():
    small = md.Cluster(hbm_bytes=1e5)
    with pytest.raises(md.runtime.RankError, match="out of simulated HBM"):
        simulate_step(LLAMA, ParallelConfig(dp=2), 4, cluster=small)


def test_an_estimator_model_becomes_the_gpt_it_describes():
    m = model("llama3_405b")
    cfg = gpt_config(m)
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.vocab_size, cfg.seq_len) == \
        (126, 16384, 128, 8, 53248, 128256, 8192)
    assert (cfg.mlp, cfg.norm, cfg.bias, cfg.tie_embeddings) == ("swiglu", "rmsnorm", False, False)
    # parameters: the published 405B plus learned positions (LLaMA rotates them instead), within 0.5%
    per_layer = 2 * 16384 * 16384 + 2 * 16384 * 1024 + 3 * 16384 * 53248 + 2 * 16384
    n = 126 * per_layer + 2 * 128256 * 16384 + 8192 * 16384 + 16384
    assert n == pytest.approx(405e9, rel=5e-3)
    gpt3 = gpt_config(model("gpt3_175b"), n_layers=2)
    assert (gpt3.mlp, gpt3.norm, gpt3.bias, gpt3.n_layers, gpt3.vocab_size) == ("gelu", "layernorm", True, 2, 51200)
    ds = gpt_config(model("deepseek_v3"))  # its latent attention and 3 dense layers (tests/test_deepseek_shape.py)
    assert (ds.kv_latent, ds.rope_dim, ds.dense_layers, ds.n_experts) == (512, 64, 3, 256)
    mixtral = gpt_config(model("mixtral_8x7b"))
    assert (mixtral.n_experts, mixtral.top_k, mixtral.d_ff, mixtral.expert_load) == (8, 2, 14336, "balanced")


def test_the_published_layout_and_its_estimator_twin():
    pc, batch = published_parallel("llama3_405b")
    assert (pc.tp, pc.pp, pc.dp, pc.microbatches, batch, pc.world_size) == (8, 16, 128, 16, 2048, 16384)
    lay = layout_of(pc, batch)
    assert (lay.tp, lay.pp, lay.dp, lay.micro_batch, lay.gpus, lay.virtual, lay.sp) == (8, 16, 128, 1, 16384, 4, True)
    assert ParallelConfig.from_layout(lay, microbatches=16, bucket_bytes=pc.bucket_bytes) == pc


_RUN_405B = """
import json, resource, sys
from minidist.viz.at_scale import side_by_side
rows = side_by_side("llama3_405b")
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
# lab 24 times 1 and 2 micro-batches per pipeline and extends the line to the published 16
from dataclasses import replace
from minidist.estimate import model
from minidist.parallel.at_scale import gpt_config, simulate_step
from minidist.viz.at_scale import published_parallel
pc, _ = published_parallel("llama3_405b")
short = [simulate_step(gpt_config(model("llama3_405b")), replace(pc, microbatches=m), 128 * m).step_time
         for m in (1, 2)]
print(json.dumps({"rows": rows, "rss": rss, "short": short}))
"""


@pytest.mark.slow
def test_llama3_405b_on_16384_simulated_gpus():
    out = subprocess.run([sys.executable, "-c", _RUN_405B], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    sim, measured, calibrated, at_peak, published = got["rows"]
    assert got["rss"] < 4e9  # the whole process: Python, numpy, the graph of 16 ranks, no values
    assert sim["memory"] < 80e9  # the layout fits an H100
    for row in (sim, measured):  # the terms partition the step of the busiest GPU
        assert sum(row["terms"].values()) == pytest.approx(row["step_time"], rel=1e-6)
    # eager kernels on a real GPU: products at a fraction of peak, attention written out, fixed costs per kernel
    assert measured["step_time"] > 1.3 * sim["step_time"]
    compute = "compute (forward, backward, recomputation)"
    assert measured["terms"][compute] > 1.3 * sim["terms"][compute]
    # the same collectives exposed, to 1%: the step begins once the last rank has finished its setup, and what an
    # early rank computed before that (at the device model's speed) is outside the window
    assert measured["terms"]["exposed collectives"] == pytest.approx(sim["terms"]["exposed collectives"], rel=1e-2)
    # the simulator charges GEMMs at peak: near the estimator's at-peak row, above its calibrated one
    assert 0.8 < sim["step_time"] / at_peak["step_time"] < 1.2
    assert sim["step_time"] < calibrated["step_time"]
    assert 0.7 < sim["tflops_per_gpu"] / published["tflops_per_gpu"] < 1.3
    # once the first micro-batch is under way each further one adds the same time: two short runs give the step
    one, two = got["short"]
    assert two + 14 * (two - one) == pytest.approx(sim["step_time"], rel=1e-3)


def test_a_model_without_a_published_layout_takes_the_planners_best():
    from minidist.estimate import plan
    from minidist.viz.at_scale import planned_parallel

    pc, batch = planned_parallel("llama3_70b", 2048)
    top = plan("llama3_70b", "dgx-h100", 2048)[0]
    assert pc.world_size == 2048 and batch == top.global_batch
    assert layout_of(pc, batch).label() == top.layout.label()


@pytest.mark.parametrize("mlp,bias", [("swiglu", False), ("gelu", True)])
def test_a_token_uses_its_top_k_experts_parameters(mlp, bias):
    from minidist.parallel.at_scale import active_params

    cfg = md.GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layers=3, n_heads=4, n_experts=6, top_k=2, d_ff=24,
                       mlp=mlp, bias=bias)
    gpt = md.GPT(cfg, seed=0)
    expert = sum(p.data.size for _, p in gpt.blocks[0].mlp.experts[0].named_parameters())
    assert active_params(cfg, gpt.num_parameters()) == gpt.num_parameters() - 3 * 4 * expert
    assert active_params(LLAMA, 1234) == 1234  # dense: every parameter
