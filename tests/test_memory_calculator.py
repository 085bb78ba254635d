"""The memory calculator's numbers are the simulated ledger's: five small layouts trained on simulated GPUs peak at
exactly the bytes the calculator shows; its widget redraws when a control moves."""

from __future__ import annotations

import matplotlib
import pytest

import minidist as md
from minidist.parallel import ParallelConfig, train

matplotlib.use("Agg")
CFG = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=4, n_heads=2)


@pytest.mark.parametrize("pc", [ParallelConfig(dp=2), ParallelConfig(dp=2, zero_stage=1),
                                ParallelConfig(dp=2, zero_stage=3), ParallelConfig(tp=2, recompute="full"),
                                ParallelConfig(pp=2, microbatches=2, dp=2, zero_stage=1)],
                         ids=["dp", "zero1", "zero3", "tp-recompute", "pp-dp"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_calculator_shows_the_ledger_peak(pc, dtype):
    run = train(CFG, pc, steps=1, global_batch=8, dtype=dtype)
    shown = md.viz.memory_breakdown(CFG, pc, 8, dtype=dtype)
    fullest = max(range(len(run.peak_memory)), key=run.peak_memory.__getitem__)
    assert shown["total"] == run.peak_memory[fullest]
    assert {k: v for k, v in shown.items() if k != "total"} == {k: run.peak_breakdown[fullest].get(k, 0.0)
                                                                for k in shown if k != "total"}


def test_the_widget_redraws_when_a_control_moves():
    ui = md.viz.memory_calculator(d_model=256, n_layers=4, seq_len=256, global_batch=8)
    before = dict(ui.breakdown)
    sliders = ui.children[0].children[0].children
    sliders[0].value = 512  # d_model
    assert ui.breakdown["params"] > 1.5 * before["params"]
    cfg = md.GPTConfig(vocab_size=32000, seq_len=256, d_model=512, n_layers=4, n_heads=8)
    assert ui.breakdown == md.viz.memory_breakdown(cfg, ParallelConfig(dp=8, zero_stage=1), 8, dtype="float32")
