"""The estimator predicts the simulator: step time and peak memory of ``md.parallel.train`` layouts, from
closed forms (``md.estimate.predict_train``), before anything runs.

Both sides use the same cluster constants and no fitted efficiency, so they must agree to rounding: any
gap is a model that is wrong, on one side or the other. The table is printed (``pytest -s``).
"""

from __future__ import annotations

import pytest

import minidist as md
from minidist.estimate import gpt_ops
from minidist.estimate.predict import predict_train
from minidist.nn import GPT, GPTConfig
from minidist.parallel import ParallelConfig

CFG = GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layers=4, n_heads=4)
BATCH = 8

LAYOUTS = {
    "1 device": ParallelConfig(),
    "dp2": ParallelConfig(dp=2),
    "dp4": ParallelConfig(dp=4),
    "tp2": ParallelConfig(tp=2),
    "tp4 (one head each)": ParallelConfig(tp=4),
    "dp2 x tp2": ParallelConfig(dp=2, tp=2),
    "accumulate 2": ParallelConfig(microbatches=2),
    "dp2 zero1": ParallelConfig(dp=2, zero_stage=1),
    "dp2 zero2 x2 micro": ParallelConfig(dp=2, zero_stage=2, microbatches=2),
    "dp2 small buckets": ParallelConfig(dp=2, bucket_bytes=40_000),
    # ZeRO-2's transient buckets set the peak when recomputation leaves little else alive late in the backward
    "dp4 zero2 recompute": ParallelConfig(dp=4, zero_stage=2, recompute="full"),
    "dp2 zero2 recompute small": ParallelConfig(dp=2, zero_stage=2, recompute=2, bucket_bytes=30_000),
    "pp2 1f1b x4": ParallelConfig(pp=2, microbatches=4),
    "pp2 gpipe x4": ParallelConfig(pp=2, microbatches=4, schedule="gpipe"),
    "pp2 interleaved v2 x4": ParallelConfig(pp=2, microbatches=4, schedule="interleaved", virtual_stages=2),
    "pp4 1f1b x4": ParallelConfig(pp=4, microbatches=4),
    "pp2 x dp2 zero1": ParallelConfig(pp=2, dp=2, microbatches=2, zero_stage=1),
    "pp2 x tp2": ParallelConfig(pp=2, tp=2, microbatches=2),
    "pp2 x tp2 x dp2": ParallelConfig(pp=2, tp=2, dp=2, microbatches=2),
    "recompute full": ParallelConfig(recompute="full"),
    "recompute every 2": ParallelConfig(recompute=2),
    "recompute 1 layer/stage": ParallelConfig(recompute="full", recompute_layers=1),
    "pp2 recompute x4": ParallelConfig(pp=2, microbatches=4, recompute="full"),
    "dp2 x tp2 recompute": ParallelConfig(dp=2, tp=2, recompute="full"),
    "dp2 zero3": ParallelConfig(dp=2, zero_stage=3),
    "dp2 zero3 no prefetch": ParallelConfig(dp=2, zero_stage=3, prefetch=0),
    "dp4 zero3 prefetch 2 x2": ParallelConfig(dp=4, zero_stage=3, prefetch=2, microbatches=2),
    "dp2 x tp2 zero3": ParallelConfig(dp=2, tp=2, zero_stage=3),
    "cp2 ring zigzag": ParallelConfig(cp=2),
    "cp4": ParallelConfig(cp=4),
    "cp2 x tp2 x dp2": ParallelConfig(cp=2, tp=2, dp=2),
    "cp2 x pp2": ParallelConfig(cp=2, pp=2, microbatches=2),
    # the ring's successor and the next stage are different links: a pipeline send does not delay the ring
    "cp2 x pp2 gpipe x4": ParallelConfig(cp=2, pp=2, microbatches=4, schedule="gpipe"),
    "cp2 zero3": ParallelConfig(cp=2, zero_stage=3),
}


def _row(name, sim_t, pred_t, sim_m, pred_m) -> str:
    return (f"{name:<22} {sim_t * 1e6:>10.4f} {pred_t * 1e6:>10.4f} {pred_t / sim_t - 1:>+8.3%}   "
            f"{sim_m / 1e6:>8.4f} {pred_m / 1e6:>8.4f} {pred_m / sim_m - 1:>+8.3%}")


def _compare(cfg, layouts: dict) -> tuple[list[str], dict]:
    lines = [f"{'layout':<28} {'sim us':>10} {'pred us':>10} {'err':>8}   {'sim MB':>8} {'pred MB':>8} {'err':>8}"]
    errors = {}
    for name, pc in layouts.items():
        run = md.parallel.train(cfg, pc, steps=2, global_batch=BATCH)
        pred = predict_train(cfg, pc, BATCH)
        sim_t, sim_m = run.time[-1], max(run.peak_memory)
        lines.append(_row(f"{name:<28}", sim_t, pred.step_time, sim_m, pred.memory["total"]))
        errors[name] = (pred.step_time / sim_t - 1, pred.memory["total"] / sim_m - 1)
    print("\n" + "\n".join(lines))
    return lines, errors


def test_prediction_equals_simulation():
    _, errors = _compare(CFG, LAYOUTS)
    bad = {k: v for k, v in errors.items() if abs(v[0]) > 1e-9 or abs(v[1]) > 1e-9}
    assert not bad, f"prediction differs from the simulator: {bad}"


def test_a_pipeline_split_across_two_nodes_pays_the_network_between_them():
    # 16 ranks on nodes of 8: pp is the outermost axis, so its two stages sit on different nodes
    pc = ParallelConfig(tp=2, cp=2, pp=2, dp=2, zero_stage=1, schedule="interleaved", virtual_stages=2,
                        microbatches=4)
    run = md.parallel.train(CFG, pc, steps=2, global_batch=8)
    pred = predict_train(CFG, pc, 8)
    assert pred.step_time == pytest.approx(run.time[-1], rel=1e-9)
    assert pred.memory["total"] == pytest.approx(max(run.peak_memory), rel=1e-9)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_op_list_is_the_autograd_charge_list(tp):
    """The compute ops of one micro-batch, in order, with the FLOPs and bytes the autograd charges."""
    pc = ParallelConfig(tp=tp)
    run = md.parallel.train(CFG, pc, steps=1, global_batch=2)
    t0, t1 = run.windows[0][0]
    sim = [(e.name, e.flops, e.nbytes) for e in run.trace
           if e.rank == 0 and e.stream == "compute" and t0 <= e.start < t1 and (e.flops or e.nbytes)]
    x = gpt_ops.Shard(2, CFG.seq_len, CFG.d_model, CFG.n_heads, CFG.d_ff, CFG.vocab_size, tp, 8)
    L = CFG.n_layers
    ops = (gpt_ops.embed_forward(x) + gpt_ops.block_forward(x) * L + gpt_ops.head_forward(x)
           + gpt_ops.head_backward(x) + gpt_ops.block_backward(x) * L + gpt_ops.embed_backward(x))
    pred = [(o.name, o.flops, o.nbytes) for o in ops if o.kind == "compute"]
    assert sim[:-1] == pred  # the last charge is the optimizer step
    assert sim[-1][0] == "optimizer.step"


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_stage_orders_are_the_runtime_schedules(schedule, v):
    from minidist.estimate.pipeline import stage_orders
    from minidist.parallel.pipeline.schedules import make_schedule

    for p, m in [(2, 1), (2, 4), (3, 3), (4, 8)]:
        if schedule == "interleaved" and m > p and m % p:
            continue
        ours = stage_orders(schedule, p, m, v)
        theirs = make_schedule(schedule, p, m, v)
        assert ours == [[tuple(a) for a in theirs.compute(r)] for r in range(p)]


def test_parameter_units_follow_registration_order():
    model = GPT(CFG)
    sizes = [p.data.size for _, p in model.named_parameters()]
    x = gpt_ops.Shard(2, CFG.seq_len, CFG.d_model, CFG.n_heads, CFG.d_ff, CFG.vocab_size, 1, 8)
    assert gpt_ops.parameters(x, CFG.n_layers) == sizes


def test_unmodelled_layouts_are_refused_by_name():
    with pytest.raises(ValueError, match="context parallelism other than ring"):
        predict_train(CFG, ParallelConfig(cp=2, cp_method="ulysses"), BATCH)
    with pytest.raises(ValueError, match="grouped-query attention with context parallelism"):
        predict_train(GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2),
                      ParallelConfig(cp=2), BATCH)
    with pytest.raises(ValueError, match="tied embeddings"):
        predict_train(GPTConfig(**{**CFG.__dict__, "tie_embeddings": True}), ParallelConfig(), BATCH)
    with pytest.raises(ValueError, match="capacity limit"):
        predict_train(GPTConfig(**{**MOE.__dict__, "capacity_factor": 1.0}), ParallelConfig(ep=2), BATCH)


def test_arguments_are_checked_by_name():
    with pytest.raises(ValueError, match="^predict_train: global_batch"):
        predict_train(CFG, ParallelConfig(), float("nan"))
    with pytest.raises(ValueError, match="^predict_train: steps"):
        predict_train(CFG, ParallelConfig(), BATCH, steps=0)
    with pytest.raises(TypeError, match="^predict_train: parallel must be an md.parallel.ParallelConfig"):
        predict_train(CFG, {"dp": 2}, BATCH)
    with pytest.raises(ValueError, match="split evenly"):
        predict_train(CFG, ParallelConfig(dp=3), BATCH)


# Mixture of experts (moe_ops.py): with k = E every token goes to every expert, so the routing is known
# before the run and the prediction must be exact; with k < E the estimator assumes balanced routing.
MOE = GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layers=2, n_heads=4, n_experts=4, top_k=4, d_ff=32)
MOE_LAYOUTS = {
    "moe 1 device": ParallelConfig(),
    "moe dp2": ParallelConfig(dp=2),
    "moe ep2": ParallelConfig(ep=2),
    "moe ep4": ParallelConfig(ep=4),
    "moe dp2 x ep2": ParallelConfig(dp=2, ep=2),
    "moe dp2 x ep2 small buckets": ParallelConfig(dp=2, ep=2, bucket_bytes=20_000),
}


def test_mixture_of_experts_with_known_routing_is_predicted_exactly():
    _, errors = _compare(MOE, MOE_LAYOUTS)
    bad = {k: v for k, v in errors.items() if abs(v[0]) > 1e-9 or abs(v[1]) > 1e-9}
    assert not bad, f"prediction differs from the simulator: {bad}"


def test_mixture_of_experts_with_balanced_routing_assumed_is_within_5_percent():
    """Top-2 of 4: which expert a token picks depends on the data; the estimator assumes each gets its share.
    On one device (or data parallel only) the share does not matter, the totals are the same; across
    expert-parallel ranks the busiest rank sets the pace, which the balanced case underestimates."""
    cfg = GPTConfig(**{**MOE.__dict__, "top_k": 2})
    _, errors = _compare(cfg, {k: v for k, v in MOE_LAYOUTS.items() if "small" not in k})
    assert abs(errors["moe 1 device"][0]) < 1e-9 and abs(errors["moe dp2"][0]) < 1e-9
    assert all(abs(t) < 0.05 and abs(m) < 0.05 for t, m in errors.values()), errors
    assert any(abs(t) > 1e-6 for t, _ in errors.values())  # the assumption is one: real routing is not balanced


def test_mixture_of_experts_ops_are_the_autograd_charges():
    """Every compute op of one step, with the FLOPs and bytes the autograd charges (as a multiset: the
    backward visits the auxiliary losses first, which this model lists with their layer)."""
    run = md.parallel.train(MOE, ParallelConfig(ep=2), steps=1, global_batch=4)
    t0, t1 = run.windows[0][0]
    sim = sorted((e.name, e.flops, e.nbytes) for e in run.trace
                 if e.rank == 0 and e.stream == "compute" and t0 <= e.start < t1 and (e.flops or e.nbytes))
    from minidist.estimate import moe_ops

    x = gpt_ops.Shard(2, MOE.seq_len, MOE.d_model, MOE.n_heads, MOE.d_ff, MOE.vocab_size, 1, 8, 1, 4, 4, 2, 2)
    L = MOE.n_layers
    ops = (gpt_ops.embed_forward(x) + moe_ops.moe_block_forward(x) * L + moe_ops.moe_head_forward(x, L)
           + moe_ops.moe_head_backward(x, L) + moe_ops.moe_block_backward(x) * L + gpt_ops.embed_backward(x))
    pred = sorted((o.name, o.flops, o.nbytes) for o in ops if o.kind == "compute")
    assert [s for s in sim if s[0] != "optimizer.step"] == pred
    dense, experts = moe_ops.moe_parameters(x, L)
    model = GPT(MOE)
    sizes = [p.data.size for n, p in model.named_parameters()]
    assert sum(dense) + sum(map(sum, experts)) * x.ep == sum(sizes)


# LLaMA's block (grouped-query attention, SwiGLU, RMS norm, no biases) and each feature alone
LLAMA = GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, mlp="swiglu",
                  norm="rmsnorm", bias=False)
LLAMA_LAYOUTS = {
    "llama 1 device": ParallelConfig(),
    "llama dp2 x tp2": ParallelConfig(dp=2, tp=2),
    "llama pp2 1f1b x4": ParallelConfig(pp=2, microbatches=4),
    "llama pp2 x tp2 x dp2": ParallelConfig(pp=2, tp=2, dp=2, microbatches=2),
    "llama dp2 zero3": ParallelConfig(dp=2, zero_stage=3),
    "llama recompute full": ParallelConfig(recompute="full"),
}


def test_llama_blocks_are_predicted_exactly():
    _, errors = _compare(LLAMA, LLAMA_LAYOUTS)
    features = {"gqa": {"n_kv_heads": 2}, "swiglu": {"mlp": "swiglu"}, "rmsnorm": {"norm": "rmsnorm"},
                "no bias": {"bias": False}, "mqa": {"n_kv_heads": 1}}
    for name, kw in features.items():
        cfg = GPTConfig(**{**CFG.__dict__, **kw})
        layouts = {f"{name} dp2": ParallelConfig(dp=2)}
        if name != "mqa":
            layouts[f"{name} tp2"] = ParallelConfig(tp=2)
        if "n_kv_heads" not in kw:
            layouts[f"{name} cp2"] = ParallelConfig(cp=2)
        errors.update(_compare(cfg, layouts)[1])
    bad = {k: v for k, v in errors.items() if abs(v[0]) > 1e-9 or abs(v[1]) > 1e-9}
    assert not bad, f"prediction differs from the simulator: {bad}"


@pytest.mark.parametrize("tp", [1, 2])
def test_llama_op_list_is_the_autograd_charge_list(tp):
    run = md.parallel.train(LLAMA, ParallelConfig(tp=tp), steps=1, global_batch=2)
    t0, t1 = run.windows[0][0]
    sim = [(e.name, e.flops, e.nbytes) for e in run.trace
           if e.rank == 0 and e.stream == "compute" and t0 <= e.start < t1 and (e.flops or e.nbytes)]
    x = gpt_ops.Shard(2, LLAMA.seq_len, LLAMA.d_model, LLAMA.n_heads, LLAMA.d_ff, LLAMA.vocab_size, tp, 8,
                      kv_heads=2, mlp="swiglu", norm="rmsnorm", bias=False)
    L = LLAMA.n_layers
    ops = (gpt_ops.embed_forward(x) + gpt_ops.block_forward(x) * L + gpt_ops.head_forward(x)
           + gpt_ops.head_backward(x) + gpt_ops.block_backward(x) * L + gpt_ops.embed_backward(x))
    assert sim[:-1] == [(o.name, o.flops, o.nbytes) for o in ops if o.kind == "compute"]
    if tp == 1:  # the gradients finish in the reverse of the order the parameters were registered
        assert gpt_ops.parameters(x, L) == [p.data.size for _, p in GPT(LLAMA).named_parameters()]
