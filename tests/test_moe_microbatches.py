"""A mixture-of-experts model trains with any number of micro-batches, under every pipeline schedule.

Its objective is defined per micro-batch (Megatron-LM's and DeepSeek-V3's): expert capacity, the load-balancing
and z losses and the routing counts of the bias update are those of each global micro-batch, the same sequences
in every layout (``BatchShare``: the batch is cut into micro-batches first, each dealt over the dp x ep ranks).
So the oracle for ``microbatches=m`` is one device accumulating the same m micro-batches, and every layout (ep, tp,
cp, dp, ZeRO-1, ZeRO-3, and pipelines under 1F1B, interleaved, ZB-H1 and DualPipeV, whose stages backpropagate
their own router losses, in the split backward's I and W passes too) reproduces its losses, gradients and
weights after 2 AdamW steps (float64, to 1e-12).
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
from minidist.nn.moe import MoE, begin_step, step_stats
from minidist.parallel import Backend, ParallelConfig, train

TOL = 1e-12
# 4 blocks: pp=2 x 2 chunks (interleaved, DualPipeV); capacity 1.0 with top-2 drops tokens, and the router losses
# weigh enough to move the router
MOE = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=4, n_heads=2, n_experts=4, top_k=2, d_ff=16,
                   capacity_factor=1.0, aux_loss_coef=0.1, z_loss_coef=0.01)
NO_DROP = md.GPTConfig(**{**MOE.__dict__, "capacity_factor": None})  # context parallelism: no capacity dropping
# DeepSeek-V3's shape in small: a dense first layer, a shared expert, latent attention with a query latent, head
# widths of their own and the decoupled key, auxiliary-loss-free balancing by routing biases
DEEPSEEK = md.GPTConfig(**{**MOE.__dict__, "shared_expert": True, "kv_latent": 8, "moe_balance": "bias",
                           "aux_loss_coef": 0.0, "bias_update": 0.05, "capacity_factor": None, "n_experts": 8,
                           "dense_layers": 1, "dense_d_ff": 24, "q_latent": 12, "qk_head_dim": 6, "v_head_dim": 4,
                           "rope_dim": 2})
SCHEDULES = {"1f1b": {}, "interleaved": {"schedule": "interleaved", "virtual_stages": 2},
             "zb-h1": {"schedule": "zb-h1"}, "dualpipev": {"schedule": "dualpipev"}}

_REFERENCE: dict = {}


def reference(cfg, m: int, global_batch: int):
    """One device accumulating ``m`` micro-batches: the oracle of every layout with ``microbatches=m``."""
    key = (repr(cfg), m, global_batch)
    if key not in _REFERENCE:
        _REFERENCE[key] = train(cfg, ParallelConfig(microbatches=m), steps=2, global_batch=global_batch)
    return _REFERENCE[key]


def assert_same_run(got, ref, what: str) -> None:
    assert set(got.params) == set(ref.params), f"{what}: different parameter names"
    loss = max(abs(a - b) for a, b in zip(got.losses, ref.losses))
    grad = max(float(np.abs(got.grads[k] - ref.grads[k]).max()) for k in ref.grads)
    weight = max(float(np.abs(got.params[k] - ref.params[k]).max()) for k in ref.params)
    assert max(loss, grad, weight) < TOL, f"{what}: loss {loss:.2e}, gradient {grad:.2e}, weight {weight:.2e} off"


def check(cfg, m: int, global_batch: int = 8, **layout) -> None:
    got = train(cfg, ParallelConfig(microbatches=m, **layout), steps=2, global_batch=global_batch)
    assert_same_run(got, reference(cfg, m, global_batch), f"{layout} microbatches={m}")


def test_the_objective_is_per_micro_batch_and_the_reference_accumulates_them():
    """Micro-batches change an MoE model's objective (capacity and router losses per micro-batch), so the tests
    below compare with one device accumulating as many; the plain one device is the reference of m = 1."""
    one, two = reference(MOE, 1, 8), reference(MOE, 2, 8)
    assert abs(one.losses[0] - two.losses[0]) > 1e-6
    plain = train(MOE, ParallelConfig(), steps=2, global_batch=8)
    assert_same_run(plain, one, "microbatches=1")


@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("layout", [{"dp": 2}, {"ep": 2}, {"tp": 2}, {"dp": 2, "zero_stage": 1},
                                    {"ep": 2, "zero_stage": 3}],
                         ids=["dp2", "ep2", "tp2", "dp2-zero1", "ep2-zero3"])
def test_two_ranks_without_a_pipeline_equal_one_device_with_as_many_micro_batches(layout, m):
    check(MOE, m, **layout)


@pytest.mark.parametrize("m", [1, 2, 4])
def test_context_parallelism_equals_one_device_with_as_many_micro_batches(m):
    check(NO_DROP, m, cp=2)


@pytest.mark.parametrize("schedule, m", [("1f1b", 1), ("1f1b", 2), ("1f1b", 4), ("interleaved", 2),
                                         ("interleaved", 4), ("zb-h1", 2), ("zb-h1", 4), ("dualpipev", 4)])
def test_every_schedule_backpropagates_each_stage_s_router_losses(schedule, m):
    """The router losses of a stage's MoE layers have no path through the activations sent on: each stage
    backpropagates its own (in ZB-H1's and DualPipeV's I pass, their router weights in the W pass)."""
    check(MOE, m, pp=2, **SCHEDULES[schedule])


@pytest.mark.parametrize("schedule, m, layout", [
    ("dualpipev", 4, {"ep": 2}),
    ("zb-h1", 2, {"dp": 2, "zero_stage": 1}),
    ("interleaved", 4, {"tp": 2}),
    ("1f1b", 2, {"ep": 2, "zero_stage": 3}),
], ids=["dualpipev-ep2", "zb-h1-dp2-zero1", "interleaved-tp2", "1f1b-ep2-zero3"])
def test_pipelines_compose_with_the_other_axes(schedule, m, layout):
    check(MOE, m, global_batch=8, pp=2, **SCHEDULES[schedule], **layout)


@pytest.mark.slow  # eight ranks each (3-6 s)
@pytest.mark.parametrize("schedule, m, layout", [
    ("dualpipev", 4, {"ep": 2, "dp": 2, "zero_stage": 3}),
    ("interleaved", 2, {"ep": 2, "tp": 2}),
    ("zb-h1", 4, {"ep": 2, "dp": 2, "zero_stage": 1}),
    ("1f1b", 2, {"cp": 2, "ep": 2}),
], ids=["dualpipev-ep2-dp2-zero3", "interleaved-ep2-tp2", "zb-h1-ep2-dp2-zero1", "1f1b-cp2-ep2"])
def test_eight_ranks_equal_one_device_with_as_many_micro_batches(schedule, m, layout):
    cfg = NO_DROP if "cp" in layout else MOE
    check(cfg, m, global_batch=16, pp=2, **SCHEDULES[schedule], **layout)


def test_a_step_sums_the_routing_loads_of_its_micro_batches():
    """``begin_step`` opens the sums the bias update and the idle experts read; without it they are the last
    forward's (a plain loop of one batch per step)."""
    moe = MoE(8, 8, 4, top_k=1, rng=0, dtype="float64")
    xs = [np.random.default_rng(i).normal(size=(6, 8)) for i in range(2)]
    loads = []
    for x in xs:
        moe(md.tensor(x))
        loads.append(moe.stats["load"])
    assert (step_stats(moe)["load"] == loads[-1]).all()
    begin_step(moe)
    for x in xs:
        moe(md.tensor(x))
    assert (step_stats(moe)["load"] == loads[0] + loads[1]).all() and step_stats(moe)["load"].sum() == 12


def test_the_routing_biases_move_by_the_loads_of_the_whole_step():
    """With ``moe_balance="bias"`` each step's bias update reads the loads summed over its micro-batches (each the
    whole global micro-batch's), so every layout moves the biases as one device does, recomputing or not."""
    check(DEEPSEEK, 2, ep=2)
    check(DEEPSEEK, 2, pp=2, recompute="full", **SCHEDULES["zb-h1"])


def test_a_deepseek_v3_shaped_model_under_ep_pp_and_dualpipev_equals_one_device():
    """Shared expert, latent attention and routing biases, experts over ep, DualPipeV over pp (DeepSeek-V3's
    layout in small)."""
    check(DEEPSEEK, 4, ep=2, pp=2, **SCHEDULES["dualpipev"])


@pytest.mark.slow  # eight ranks (about 5 s)
def test_a_deepseek_v3_shaped_model_under_ep_pp_dp_and_dualpipev_equals_one_device():
    check(DEEPSEEK, 4, global_batch=16, ep=2, pp=2, dp=2, **SCHEDULES["dualpipev"])


def test_planned_routing_reads_each_token_s_place_in_its_global_micro_batch():
    """A plan (``expert_load``) deals experts by the token's index in its global micro-batch, so layouts that
    split a micro-batch over ranks route as one device does."""
    planned = md.GPTConfig(**{**MOE.__dict__, "expert_load": (0.4, 0.3, 0.2, 0.1), "n_experts": 4})
    check(planned, 2, dp=2)
    check(planned, 4, pp=2, ep=2, **SCHEDULES["zb-h1"])


def test_a_shape_only_run_with_micro_batches_lets_one_rank_stand_for_its_peers():
    """Planned per micro-batch, every ep rank's experts receive the same rows in each micro-batch, so a shape-only
    run of the DeepSeek-shaped layout (DualPipeV over pp, experts over ep, dp) can simulate one rank per stage."""
    cfg = md.GPTConfig(vocab_size=48, seq_len=16, d_model=16, n_layers=4, n_heads=4, n_experts=4, top_k=2, d_ff=16,
                       expert_load="balanced", shared_expert=True, kv_latent=8)
    pc = ParallelConfig(pp=2, ep=2, dp=2, microbatches=4, **SCHEDULES["dualpipev"])
    kw = dict(steps=1, global_batch=16, backend=Backend("inprocess", shape_only=True))
    every, some = (train(cfg, pc, **{**kw, "backend": Backend("inprocess", shape_only=True, representatives=r)})
                   for r in (False, True))
    assert list(some.time) == list(every.time) and list(some.peak_memory) == list(every.peak_memory)
