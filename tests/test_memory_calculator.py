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
def test_the_calculator_shows_the_ledger_peak(pc):
    run = train(CFG, pc, steps=1, global_batch=8)
    shown = md.viz.memory_breakdown(CFG, pc, 8)
    assert shown["total"] == max(run.peak_memory)
    assert set(shown) == {"params", "grads", "optimizer", "activations", "buffers", "total"}


def test_the_widget_redraws_when_a_control_moves():
    ui = md.viz.memory_calculator(d_model=256, n_layers=4, seq_len=256, global_batch=8)
    before = dict(ui.breakdown)
    sliders = ui.children[0].children[0].children
    sliders[0].value = 512  # d_model
    assert ui.breakdown["params"] > 1.5 * before["params"]
    cfg = md.GPTConfig(vocab_size=32000, seq_len=256, d_model=512, n_layers=4, n_heads=8)
    assert ui.breakdown == md.viz.memory_breakdown(cfg, ParallelConfig(dp=8, zero_stage=1), 8, dtype="float32")
