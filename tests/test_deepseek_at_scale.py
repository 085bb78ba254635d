"""DeepSeek-V3's published layout, shape-only at full scale: 671B parameters on 2,048 simulated H800s (PP 16 with
DualPipeV, EP 64, ZeRO-1 over DP 2 x EP 64; 15,360 sequences of 4,096 tokens, one per micro-batch: 120 per
pipeline), one representative rank per pipeline stage.

The HBM is lifted so that the step runs to its end and its memory can be read (the simulator books a bf16 run
with attention's probabilities materialised; DeepSeek trains in FP8 with fused attention kernels). The published
figure is a step's share of the pre-training GPU-hours (2.664M H800-hours for 14.8T tokens, about 19.9 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_RUN = """
import json, math, time
import minidist as md
from minidist.estimate import cluster, model
from minidist.parallel.at_scale import gpt_config, simulate_step
from minidist.viz.at_scale import published_parallel
m = model("deepseek_v3")
spec = cluster("h800")
pc, batch = published_parallel("deepseek_v3")
step = simulate_step(gpt_config(m), pc, batch,
                     cluster=md.Cluster(spec.gpu, spec.gpus_per_node, spec.intra, spec.inter, hbm_bytes=1e13))
pub = m.published_layout
steps = m.tokens / (batch * m.seq_len)
published = pub["pretrain_gpu_hours"] * 3600 / pub["gpus"] / steps
states = sum(step.breakdown[k] for k in ("params", "grads", "optimizer"))
print(json.dumps(dict(step=step.step_time, compute=step.compute_time, memory=step.peak_memory, states=states,
                      ranks=step.simulated_ranks, gpus=step.gpus, params=step.num_params, mfu=step.mfu,
                      published=published, wall=step.wall_seconds, breakdown=step.breakdown)))
"""


@pytest.mark.slow  # about 3 minutes of one core
def test_deepseek_v3_published_layout_on_2048_simulated_h800s():
    out = subprocess.run([sys.executable, "-c", _RUN], capture_output=True, text=True, timeout=1500,
                         env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\nDeepSeek-V3 on {got['gpus']} H800 ({got['ranks']} ranks run in {got['wall']:.0f} s): "
          f"{got['step']:.1f} s/step simulated (compute {got['compute']:.1f} s, MFU {got['mfu']:.1%}), "
          f"{got['published']:.1f} s published; {got['memory'] / 1e9:.0f} GB on the fullest GPU "
          f"({got['states'] / 1e9:.1f} GB of weights, gradients and optimizer state) of 80 GB")
    assert (got["gpus"], got["ranks"]) == (2048, 16)
    assert got["params"] == pytest.approx(671e9, rel=1e-3)
    assert 0 < got["compute"] < got["step"] < float("inf") and 0 < got["memory"] < float("inf")
    # every GPU does its share of 6 N per token at bf16 peak at the least
    assert got["mfu"] < 1
    # the model states fit an H800 with room to spare (ZeRO-1 over 128 ranks for dense weights, 2 for experts)
    assert got["states"] < 20e9
