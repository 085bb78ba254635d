"""The analytic model's terms that were wrong at scale, each derived again and checked against its derivation,
the simulator or a published figure: ZeRO-3 traffic and overlap, fp32 main gradients, embeddings on the end
stages, the working set of a recomputed layer, causal ring attention, DualPipe, expert all-to-all overlap."""

from __future__ import annotations

import dataclasses

import pytest

import minidist as md
from minidist.nn import GPTConfig
from minidist.parallel import ParallelConfig

E = md.estimate
LLAMA, H100 = E.model("llama3_405b"), E.cluster("dgx-h100")


def _est(layout, **kw):
    return E.estimate_layout(LLAMA, H100, layout, 2048, 8192, E.CALIBRATED, **kw)


def test_zero3_moves_one_and_a_half_times_ddps_bytes_in_the_simulator():
    """Per step ZeRO-3 gathers each unit twice and reduce-scatters it once: 3 halves of an all-reduce."""
    cfg = GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layers=2, n_heads=4)
    ddp = md.parallel.train(cfg, ParallelConfig(dp=2), steps=1, global_batch=4)
    z3 = md.parallel.train(cfg, ParallelConfig(dp=2, zero_stage=3), steps=1, global_batch=4)
    assert sum(z3.comm_bytes[0]) / sum(ddp.comm_bytes[0]) == pytest.approx(1.5, rel=0.01)


@pytest.mark.parametrize("recompute, gathers", [(None, 2), ("full", 3)])
def test_zero3_gathers_per_layer_on_each_gpus_nic(recompute, gathers):
    """2 + r gathers and one reduce-scatter per layer and micro-batch (r = the recomputed share: frameworks
    reshard after the recomputation's forward and gather again for the backward, so full recomputation
    makes ZeRO-3 cost 2 all-reduces' worth, not 1.5); the group spans nodes with one GPU each, so its
    rings run at one NIC's bandwidth and pay p - 1 latencies per layer. With no overlap all of it shows."""
    lay = E.Layout(tp=8, dp=2048, zero_stage=3, recompute=recompute)
    e = _est(lay, dp_overlap=0.0)
    unit = (LLAMA.layers * (LLAMA.dense_params - LLAMA.embedding_params) / LLAMA.layers
            + 2 * LLAMA.vocab * LLAMA.hidden) / 8 / LLAMA.layers
    link = H100.inter
    ag = E.collective_time("all_gather", 2 * unit, 2048, link.alpha, link.beta)
    rs = E.collective_time("reduce_scatter", 2 * unit, 2048, link.alpha, link.beta)
    assert e.comm["dp"] == pytest.approx(e.microbatches * LLAMA.layers * (gathers * ag + rs) + ag)
    if recompute == "full":  # in bytes: 3 gathers + 1 reduce-scatter = 2 all-reduces
        def bw_only(op):
            return E.collective_time(op, 2 * unit, 2048, 0.0, link.beta)
        assert (3 * bw_only("all_gather") + bw_only("reduce_scatter")) / bw_only("all_reduce") == pytest.approx(2.0)


def test_zero3_overlap_is_bounded_by_the_compute_left():
    lay = E.Layout(tp=8, dp=2048, zero_stage=3, recompute="full")
    hidden_all = _est(lay, dp_overlap=1.0)
    none = _est(lay, dp_overlap=0.0)
    # what overlap hides is at most the compute of the micro-batches: the rest stays on the critical path
    compute = hidden_all.microbatches * (hidden_all.compute - _optimizer_time(hidden_all)) / hidden_all.microbatches
    assert none.comm["dp"] - hidden_all.comm["dp"] == pytest.approx(compute)
    assert hidden_all.comm["dp"] > 0


def _optimizer_time(e) -> float:
    """The estimate's optimizer step (36 bytes of HBM traffic per local sharded weight), part of ``compute``."""
    local = e.memory["params"] / 2 * (e.layout.dp * e.layout.cp if e.layout.zero_stage == 3 else 1)
    return 36 * local / (e.layout.dp * e.layout.cp if e.layout.zero_stage >= 1 else 1) / H100.gpu.hbm_bw


def test_fp32_main_gradients_make_18_bytes_per_parameter():
    lay = E.Layout(tp=8, pp=16, dp=128, zero_stage=0, recompute="full")
    a, b = _est(lay), _est(dataclasses.replace(lay, fp32_grads=True))
    per_param = sum(b.memory[k] for k in ("params", "grads", "optimizer")) / (b.memory["params"] / 2)
    assert per_param == pytest.approx(18)
    assert b.memory["grads"] == pytest.approx(2 * a.memory["grads"])


def test_the_fullest_stage_holds_its_layers_and_an_embedding_matrix():
    lay = E.Layout(tp=8, pp=16, dp=128, zero_stage=0, recompute="full")
    per_layer = (LLAMA.dense_params - LLAMA.embedding_params) / LLAMA.layers
    stage = (-(-LLAMA.layers // 16) * per_layer + LLAMA.vocab * LLAMA.hidden) / 8
    assert _est(lay).memory["params"] == pytest.approx(2 * stage)


def test_full_recomputation_keeps_one_rebuilt_layer_on_top_of_the_inputs():
    lay = E.Layout(tp=8, pp=16, dp=128, zero_stage=1, recompute="full")
    e = _est(lay)
    layers = -(-LLAMA.layers // 16)
    inputs = E.activation_bytes(8192, 1, LLAMA.hidden, LLAMA.heads, layers, 8, True, "full")
    one = E.activation_bytes(8192, 1, LLAMA.hidden, LLAMA.heads, 1, 8, True, "selective")
    inflight = E.inflight_microbatches(16, e.microbatches, "1f1b")
    assert e.memory["activations"] == pytest.approx(inputs * inflight + one)  # one layer is rebuilt at a time


def test_ring_attention_hides_only_behind_causal_attention():
    """With cp the ring overlaps the chunk's attention, which a causal mask halves: a layout whose ring is
    hidden by the non-causal count but not by the causal one shows the difference."""
    lay = E.Layout(tp=8, cp=2, dp=1024)
    e = _est(lay)
    b, s, h, cp, tp = 1, 8192, LLAMA.hidden, 2, 8
    link = H100.link_for(tp * cp)
    chunk = 2 * b * (s / cp) * LLAMA.kv_heads * LLAMA.head_dim * 2 / tp
    ring = 3 * (cp - 1) * (link.alpha + chunk / link.beta)
    attn = 4 * b * (s / cp) * s * h / tp * (3 + 1) / (989.4e12 * E.CALIBRATED.gemm)
    assert e.comm["cp"] == pytest.approx(e.microbatches * LLAMA.layers * max(0.0, ring - attn / 2))


def test_dualpipe_bubble_is_deepseeks_and_hides_the_expert_all_to_all():
    ds, h800 = E.model("deepseek_v3"), E.cluster("h800")
    lay = E.Layout(pp=16, dp=128, ep=64, zero_stage=1, schedule="1f1b", recompute="full")
    one_f_one_b = E.estimate_layout(ds, h800, lay, 15360, 4096, E.CALIBRATED)
    dual = E.estimate_layout(ds, h800, dataclasses.replace(lay, schedule="dualpipe"), 15360, 4096, E.CALIBRATED)
    assert dual.comm["ep"] < 0.05 * one_f_one_b.comm["ep"]
    assert dual.bubble < one_f_one_b.bubble / 2
    assert dual.memory["params"] == pytest.approx(2 * one_f_one_b.memory["params"])  # two stages per GPU
    no_overlap = E.estimate_layout(ds, h800, dataclasses.replace(lay, schedule="dualpipe"), 15360, 4096,
                                   E.CALIBRATED, ep_overlap=0.0)
    assert no_overlap.comm["ep"] == pytest.approx(one_f_one_b.comm["ep"])
