"""Strategies compose on one mesh: every layout either trains exactly like one device or is refused up front.

The oracle is ``md.parallel.train(cfg, ParallelConfig())``: every combination of (dp, tp, pp, cp, ep)
in {1, 2}^5 (world size <= 8) with each data-parallel flavour (DDP, ZeRO-1, ZeRO-2, ZeRO-3, FSDP)
and each recomputation mode reproduces its losses, gradients and weights after 3 AdamW steps
(float64, to 1e-10). None is refused: the refusals left in ``md.parallel.train`` are semantic (a
layout that would compute another objective, listed in ``minidist/parallel/refusals.py``), and the
grid avoids them. Its MoE layouts run one micro-batch, whose reference is the plain one device; with several the
reference is one device with as many (tests/test_moe_microbatches.py).

The cases a user found silently wrong are tests of their own below.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

import numpy as np
import pytest

import minidist as md
import minidist.parallel.config as config_module
from minidist.collectives import known_algorithms
from minidist.data import get_batch, load_tokens
from minidist.parallel import AdamW, ParallelConfig

TOL = 1e-10
DENSE = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2)
MOE = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2, n_experts=4, top_k=2, d_ff=16)
FLAVOURS = {"ddp": {}, "zero1": {"zero_stage": 1}, "zero2": {"zero_stage": 2}, "zero3": {"zero_stage": 3},
            "fsdp": {"fsdp": True}}
RECOMPUTE = (None, "full", "selective")
AXES = ("dp", "tp", "pp", "cp", "ep")
LAYOUTS = [dict(zip(AXES, sizes)) for sizes in itertools.product((1, 2), repeat=5) if np.prod(sizes) <= 8]

_REFERENCE: dict = {}


def reference(cfg, **kw):
    key = (repr(cfg), tuple(sorted(kw.items())))  # not id(cfg): a collected config's id is reused by the next
    if key not in _REFERENCE:
        _REFERENCE[key] = md.parallel.train(cfg, ParallelConfig(), steps=3, global_batch=4, **kw)
    return _REFERENCE[key]


def assert_same_run(got, ref, what: str) -> None:
    loss = max(abs(a - b) for a, b in zip(got.losses, ref.losses))
    grad = max(float(np.abs(got.grads[k] - ref.grads[k]).max()) for k in ref.grads)
    weight = max(float(np.abs(got.params[k] - ref.params[k]).max()) for k in ref.params)
    assert set(got.params) == set(ref.params), f"{what}: different parameter names"
    assert max(loss, grad, weight) < TOL, f"{what}: loss {loss:.2e}, gradient {grad:.2e}, weight {weight:.2e} off"


def name(layout: dict, flavour: str, recompute) -> str:
    axes = " ".join(f"{a}={layout[a]}" for a in AXES)
    return f"{axes} {flavour} recompute={recompute}"


def run_layout(layout: dict) -> list[str]:
    """Train every flavour x recompute mode of one layout against one device; return their names."""
    cfg = MOE if layout["ep"] > 1 else DENSE
    done = []
    for (flavour, extra), recompute in itertools.product(FLAVOURS.items(), RECOMPUTE):
        what = name(layout, flavour, recompute)
        # a pipeline of dense layers gets two micro-batches; an MoE model one, so that the plain one device stays
        # its reference (its capacity and load-balancing loss are statistics of each micro-batch)
        pc = ParallelConfig(**layout, **extra, recompute=recompute, microbatches=1 if cfg is MOE else layout["pp"])
        assert_same_run(md.parallel.train(cfg, pc, steps=3, global_batch=4), reference(cfg), what)
        done.append(what)
    return done


def _grid_param(lay: dict):
    # make test runs each axis alone with every flavour (two ranks); the compositions of four and eight ranks cost
    # 4-5 s each, so make test-slow (and CI) runs them; make test still composes axes in the tests below and in
    # labs 15, 16 and 24
    ranks = np.prod(list(lay.values()))
    marks = [pytest.mark.slow] if ranks > 2 else []
    return pytest.param(lay, id="-".join(f"{a}{v}" for a, v in lay.items()), marks=marks)


@pytest.mark.parametrize("layout", [_grid_param(lay) for lay in LAYOUTS])
def test_every_layout_equals_one_device(layout):
    assert len(run_layout(layout)) == len(FLAVOURS) * len(RECOMPUTE)


@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_tied_embeddings_compose_with_pipelines_and_every_data_parallel_flavour(flavour):
    """The first and the last stage both hold the embedding matrix; their gradients are summed after each
    stage's data-parallel reduction, so both copies take the same step."""
    cfg = md.GPTConfig(**{**DENSE.__dict__, "tie_embeddings": True})
    ref = reference(cfg)
    for layout in ({"pp": 2, "dp": 2}, {"pp": 2, "tp": 2, "recompute": "full"}):
        pc = ParallelConfig(**layout, **FLAVOURS[flavour], microbatches=2)
        got = md.parallel.train(cfg, pc, steps=3, global_batch=4)
        assert_same_run(got, ref, f"tied {layout} {flavour}")


@pytest.mark.parametrize("layout", [
    {"cp": 2, "tp": 2, "sequence_parallel": True},
    {"cp": 2, "tp": 2, "sequence_parallel": True, "dp": 2, "zero_stage": 3, "cp_layout": "contiguous"},
    {"cp": 2, "tp": 2, "sequence_parallel": True, "pp": 2, "microbatches": 2, "recompute": "selective"},
    {"pp": 2, "dp": 2, "offload": "optimizer", "microbatches": 2},
    {"pp": 2, "dp": 2, "zero_stage": 3, "offload": "optimizer+params", "microbatches": 2},
    {"pp": 2, "dp": 2, "zero_stage": 3, "schedule": "zb-h1", "microbatches": 2},
], ids=["cp-sp", "cp-sp-zero3", "cp-sp-pp", "pp-offload", "pp-zero3-offload-params", "pp-zero3-zero-bubble"])
def test_compositions_outside_the_grid(layout):
    """Sequence parallelism with cp cuts each cp rank's positions once more over tp; offloading and
    zero-bubble schedules act on a pipeline stage's own state."""
    got = md.parallel.train(DENSE, ParallelConfig(**layout), steps=3, global_batch=4)
    assert_same_run(got, reference(DENSE), str(layout))


def test_recomputing_the_first_layers_of_each_stage_only():
    """Megatron's block method (--recompute-num-layers), which the estimator's planner chooses: the first n
    blocks of each stage are checkpointed, the others keep their activations."""
    cfg = md.GPTConfig(**{**DENSE.__dict__, "n_layers": 4})
    ref = reference(cfg)
    peaks = {}
    for n in (None, 1, 2):
        for layout in ({"dp": 2}, {"pp": 2, "microbatches": 2}):
            pc = ParallelConfig(**layout, recompute="full" if n else None, recompute_layers=n)
            got = md.parallel.train(cfg, pc, steps=3, global_batch=4)
            assert_same_run(got, ref, f"{layout} recompute_layers={n}")
            peaks[n, "pp" in layout] = got.memory[0]["activations"]
    for pp in (False, True):  # the more layers recomputed, the fewer activations held
        assert peaks[2, pp] < peaks[1, pp] < peaks[None, pp], (pp, peaks)
    with pytest.raises(ValueError, match="recompute_layers"):
        ParallelConfig(recompute="selective", recompute_layers=1)


def test_ulysses_with_sequence_parallelism():
    cfg = md.GPTConfig(**{**DENSE.__dict__, "n_heads": 4})
    got = md.parallel.train(cfg, ParallelConfig(cp=2, tp=2, sequence_parallel=True, cp_method="ulysses"), steps=3,
                            global_batch=4)
    assert_same_run(got, reference(cfg), "ulysses with sequence parallelism")


@pytest.mark.parametrize("model, layout, reason", [
    ("moe", {"tp": 2, "sequence_parallel": True}, "route only its own tokens"),
    ("moe-capacity", {"cp": 2}, "would depend on the layout"),
    ("dropout", {"dp": 2}, "masks would differ"),
])
def test_every_refusal_left_is_one_of_meaning_and_documented(model, layout, reason):
    cfg = {"moe": MOE, "moe-capacity": md.GPTConfig(**{**MOE.__dict__, "capacity_factor": 1.0}),
           "dropout": md.GPTConfig(**{**DENSE.__dict__, "dropout": 0.1})}[model]
    with pytest.raises(ValueError, match=reason):
        md.parallel.train(cfg, ParallelConfig(**layout), steps=1, global_batch=8)
    doc = " ".join(config_module.__doc__.split())
    topic = {"moe": "MoE with sequence parallelism",
             "moe-capacity": "capacity dropping", "dropout": "dropout > 0"}[model]
    assert topic in doc, f"the refusal {reason!r} is not listed in ParallelConfig's documentation"


def test_what_is_not_built_yet_says_so_and_is_listed():
    """The pairs refused because they are not built (not for a reason of meaning) say so, and are listed."""
    cases = [(MOE, ParallelConfig(dp=2, compression=md.parallel.TopK(0.1)), {}, "gradient compression (TopK)")]
    for cfg, pc, kw, what in cases:
        with pytest.raises(ValueError, match=f"{re.escape(what)} .*not built yet"):
            md.parallel.train(cfg, pc, steps=1, global_batch=8, **kw)
    doc = " ".join(config_module.__doc__.split())
    assert "Not built yet" in doc and "``compression`` with a mixture-of-experts model" in doc


# -- the cases that were silently wrong ------------------------------------------------------


def test_context_parallel_with_selective_recompute_attends_across_ranks():
    """Selective recomputation wraps the installed attention core (ring attention), not the plain one."""
    ref = reference(DENSE)
    for method in ("ring", "ulysses"):
        got = md.parallel.train(DENSE, ParallelConfig(cp=2, cp_method=method, recompute="selective"), steps=3,
                                global_batch=4)
        assert_same_run(got, ref, f"cp=2 {method} selective")


@pytest.mark.parametrize("recompute", ["full", 2])
def test_router_losses_keep_their_gradient_under_recomputation(recompute):
    moe = md.GPTConfig(**{**MOE.__dict__, "capacity_factor": 1.0, "aux_loss_coef": 0.1})
    ref = reference(moe)
    for layout in ({}, {"dp": 2}, {"ep": 2}):
        got = md.parallel.train(moe, ParallelConfig(**layout, recompute=recompute), steps=3, global_batch=4)
        assert_same_run(got, ref, f"MoE {layout} recompute={recompute}")
        router = [k for k in ref.grads if "router" in k]
        assert router and all(np.abs(ref.grads[k]).max() > 0 for k in router)


def test_an_expert_no_token_reaches_is_not_updated_on_one_device_or_many():
    """torch's rule (no gradient, no update: no decay, no moment, no step count) in the plain loop and the trainer."""
    cfg = md.GPTConfig(vocab_size=48, seq_len=4, d_model=16, n_layers=2, n_heads=2, n_experts=8, top_k=1, d_ff=16,
                       dtype="float64")
    tokens = load_tokens(20_000, seed=0)[0]
    model = md.GPT(cfg, seed=0)
    opt = md.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    rng = np.random.default_rng([0, 2])  # the trainer's batch stream for seed 0
    losses, idle = [], []
    for _ in range(4):
        x, y = get_batch(tokens, 2, cfg.seq_len, rng)
        opt.zero_grad()
        loss = model(x, y)[1]
        loss.backward()
        opt.step()
        losses.append(float(loss.data))
        idle.append(md.nn.moe.idle_expert_params(model))
    # the case that matters: an expert trained in an earlier step and idle now (its moments would move it)
    assert any(idle[s] - idle[t] for s in range(4) for t in range(s)), "no expert went idle after training"
    plain = {k: p.data for k, p in model.named_parameters()}
    for layout in ({}, {"dp": 2}, {"ep": 2}, {"ep": 2, "zero_stage": 3}, {"dp": 2, "fsdp": True}):
        got = md.parallel.train(cfg, ParallelConfig(**layout), steps=4, global_batch=2,
                                optimizer=AdamW(lr=1e-2, weight_decay=0.1))
        assert max(abs(a - b) for a, b in zip(got.losses, losses)) < TOL, layout
        assert max(float(np.abs(got.params[k] - plain[k]).max()) for k in plain) < TOL, layout


@pytest.mark.parametrize("algorithm", known_algorithms())
def test_every_collective_algorithm_trains_every_data_parallel_flavour(algorithm):
    """The layout's algorithm goes to every collective that offers it; the others keep the runtime's choice."""
    ref = reference(DENSE)
    for flavour, extra in FLAVOURS.items():
        got = md.parallel.train(DENSE, ParallelConfig(dp=2, algorithm=algorithm, **extra), steps=3, global_batch=4)
        assert_same_run(got, ref, f"dp=2 {flavour} algorithm={algorithm}")


def test_the_algorithm_reaches_the_gradient_all_reduce_and_unknown_ones_are_refused():
    def reduce_times(algorithm):
        r = md.parallel.train(DENSE, ParallelConfig(dp=4, algorithm=algorithm), steps=1, global_batch=4)
        return sorted(round(e.duration, 12) for e in r.trace if e.stream == "comm" and e.name == "all_reduce")

    assert reduce_times("ring") != reduce_times("tree")
    with pytest.raises(ValueError, match="algorithm must be None"):
        ParallelConfig(dp=2, algorithm="butterfly")


@pytest.mark.slow  # trains each of the planner's top layouts (10 s); lab 18 runs some of them in make test too
def test_a_plan_of_the_estimator_runs_as_is():
    """md.estimate.plan and md.parallel.train describe one mesh: every planned layout of a toy GPT trains like
    one device with the plan's batch."""
    from minidist.estimate.models import ModelConfig

    toy = ModelConfig(name="toy", layers=2, hidden=16, heads=2, kv_heads=2, ffn=64, vocab=48, seq_len=8,
                      gated=False, tied=False, params=0, active_params=0, source="tests/test_compose.py")
    estimates = md.estimate.plan(toy, "dgx-h100", gpus=4, global_batch=8, seq_len=8, top=40)
    ran = 0
    for est in estimates:
        lay = est.layout
        got = md.parallel.train(DENSE, est, steps=2, global_batch=est.global_batch)
        pc = ParallelConfig.from_layout(est)
        assert pc.world_size == lay.gpus == 4 and pc.dp * pc.ep == lay.dp and pc.microbatches == est.microbatches
        ref = md.parallel.train(DENSE, ParallelConfig(), steps=2, global_batch=est.global_batch)
        assert_same_run(got, ref, lay.label())
        ran += 1
    assert ran == len(estimates) >= 3
    moe = ParallelConfig.from_layout(replace(estimates[0].layout, dp=4, ep=2, pp=1, cp=1, schedule="1f1b"))
    assert (moe.dp, moe.ep, moe.world_size) == (2, 2, 4)


def test_parallelize_is_the_one_place_and_its_loop_is_train_s():
    """A hand-written rank loop over md.parallel.parallelize reproduces md.parallel.train's losses and weights."""
    layout = ParallelConfig(dp=2, tp=2, cp=2, zero_stage=1, recompute="selective")
    tokens = load_tokens(20_000, seed=0)[0]

    def rank():
        from minidist.parallel import build_mesh, parallelize
        from minidist.parallel.data.flat_optim import FlatOptimizer
        from minidist.parallel.memory import state_bytes_per_param

        cfg = md.GPTConfig(**{**DENSE.__dict__, "dtype": "float64"})
        mesh = build_mesh(layout)
        opt = FlatOptimizer("adamw", lr=1e-3)
        par = parallelize(md.GPT(cfg, seed=0), mesh, layout, opt, state_bytes_per_param("float64", "adamw"))
        assert [type(par.engine).__name__, type(par.reducer).__name__] == ["MicroBatches", "ZeroOptimizer"]
        rng, losses = np.random.default_rng([0, 2]), []
        for _ in range(2):
            xs, ys, weights = par.batch.split(*get_batch(tokens, 4, cfg.seq_len, rng))
            losses.append(par.engine.run(xs, ys, weights))
            opt.step(par.reducer.pieces())
            par.reducer.after_step(par.model)
        return mesh.get_local_rank("tp"), losses

    res = md.launch(rank, world_size=layout.world_size)
    by_hand = [sum(losses[s] for tp, losses in res if tp == 0) for s in range(2)]
    trained = md.parallel.train(DENSE, layout, steps=2, global_batch=4)
    assert max(abs(a - b) for a, b in zip(by_hand, trained.losses)) < 1e-12
