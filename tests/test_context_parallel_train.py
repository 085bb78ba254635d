"""md.parallel.train with cp and ep equals the single-device run (chapters 17-18, labs 11-12).

float64, 3 AdamW steps: the loss every step, the last gradients and the final weights of every
layout match ``ParallelConfig()`` (one device) for the same model, seed and global batch. Also: the
traffic of a cp step contains the ring's closed form, and bad layouts are refused before launch.
"""

import numpy as np
import pytest

import minidist as md
from minidist.parallel import AdamW, ParallelConfig, train

DENSE = md.GPTConfig(vocab_size=48, seq_len=16, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2)
MOE = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2, n_experts=4, top_k=2,
                   capacity_factor=1.0, shared_expert=True, d_ff=24)
MOE8 = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2, n_experts=8, top_k=1,
                    capacity_factor=1.25, d_ff=24)
MOE8_NODROP = md.GPTConfig(**{**MOE8.__dict__, "capacity_factor": None})
STEPS, BATCH = 3, 8
TOL = dict(rtol=1e-9, atol=1e-12)
_oracles: dict = {}


def oracle(cfg):
    key = id(cfg)
    if key not in _oracles:
        _oracles[key] = train(cfg, ParallelConfig(), steps=STEPS, global_batch=BATCH,
                              optimizer=AdamW(lr=1e-2, weight_decay=0.01))
    return _oracles[key]


def assert_same(r, ref):
    np.testing.assert_allclose(r.losses, ref.losses, **TOL)
    assert set(r.params) == set(ref.params)
    for name in ref.params:
        np.testing.assert_allclose(r.grads[name], ref.grads[name], err_msg=name, **TOL)
        np.testing.assert_allclose(r.params[name], ref.params[name], err_msg=name, **TOL)


LAYOUTS = {
    "cp2_ring_zigzag": (DENSE, ParallelConfig(cp=2)),
    "cp4_ring_contiguous": (DENSE, ParallelConfig(cp=4, cp_layout="contiguous")),
    "cp2_ulysses_dp2": (DENSE, ParallelConfig(cp=2, dp=2, cp_method="ulysses")),
    "cp2_ring_zero3": (DENSE, ParallelConfig(cp=2, zero_stage=3)),
    "moe_dp2": (MOE, ParallelConfig(dp=2)),
    "ep2": (MOE, ParallelConfig(ep=2)),
    "ep4": (MOE, ParallelConfig(ep=4)),
    "ep2_dp2": (MOE, ParallelConfig(ep=2, dp=2)),
    "ep4_E8_top1": (MOE8, ParallelConfig(ep=4)),
    "ep2_cp2_E8": (MOE8_NODROP, ParallelConfig(ep=2, cp=2, cp_layout="contiguous")),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_layout_equals_one_device(name):
    cfg, pc = LAYOUTS[name]
    ref = oracle(cfg)
    res = train(cfg, pc, steps=STEPS, global_batch=BATCH, optimizer=AdamW(lr=1e-2, weight_decay=0.01))
    assert_same(res, ref)
    assert ref.losses[-1] < ref.losses[0]


def test_moe_oracle_includes_the_router_losses_and_drops_tokens():
    ref = oracle(MOE)
    model = md.GPT(md.GPTConfig(**{**MOE.__dict__, "dtype": "float64"}), seed=0)
    tokens, _ = md.data.load_tokens(20_000, seed=0)
    x, y = md.data.get_batch(tokens, BATCH, MOE.seq_len, np.random.default_rng([0, 2]))
    _, loss = model(x, y)
    assert ref.losses[0] == pytest.approx(float(loss.data), rel=1e-12)  # GPT.forward adds the aux losses
    assert model.blocks[0].mlp.stats["dropped"] > 0  # capacity 1.0 with top-2 drops some assignments


def test_expert_weights_are_sharded_over_ep():
    res = train(MOE, ParallelConfig(ep=4), steps=1, global_batch=BATCH)
    ref = oracle(MOE)
    expert_bytes = sum(v.nbytes for k, v in ref.params.items() if ".experts." in k)
    dense_bytes = sum(v.nbytes for k, v in ref.params.items() if ".experts." not in k)
    for mem in res.memory:  # each rank holds 1/4 of the experts and all of the rest
        assert mem["params"] == pytest.approx(dense_bytes + expert_bytes / 4, rel=0.05)


def test_cp_step_traffic_contains_the_ring_closed_form():
    # cp only, one sequence: per layer the forward ring moves 2(p-1)/p of K/V, the backward the same
    # K/V again plus a full turn of their gradients; the rest is the gradient all-reduce
    cfg, p, batch = DENSE, 2, 2
    res = train(cfg, ParallelConfig(cp=p), steps=1, global_batch=batch)
    kv_hidden = cfg.n_kv_heads * cfg.head_dim
    ring = md.estimate.cp_ring_bytes_per_layer(batch, cfg.seq_len, kv_hidden, p, dtype_bytes=8)
    per_layer = ring + ring + ring * p / (p - 1)
    params = sum(v.size for v in res.params.values()) * 8
    for r in range(p):
        ar = md.estimate.dp_all_reduce_bytes(params, p, dtype_bytes=1)
        assert res.comm_bytes[0][r] == pytest.approx(cfg.n_layers * per_layer + ar, rel=0.01)


@pytest.mark.parametrize("cfg,pc,match", [
    (DENSE, ParallelConfig(cp=2, cp_method="striped"), "cp_method must be one of"),
    (DENSE, ParallelConfig(cp=3), "seq_len=16 must split into 6 equal chunks"),
    (md.GPTConfig(**{**DENSE.__dict__, "seq_len": 6}),
     ParallelConfig(cp=2, tp=2, sequence_parallel=True, cp_layout="contiguous"),
     r"seq_len / cp = 6 / 2 = 3 positions over tp=2"),
    (md.GPTConfig(vocab_size=48, seq_len=16, d_model=18, n_layers=1, n_heads=3),
     ParallelConfig(cp=2, cp_method="ulysses"), "3 query heads .* must divide evenly"),
    (DENSE, ParallelConfig(ep=2), "needs a mixture-of-experts model"),
    (MOE, ParallelConfig(ep=3), "4 experts cannot be split evenly over ep=3"),
    (MOE, ParallelConfig(ep=2, tp=2, sequence_parallel=True), "do not compose with sequence_parallel"),
    (MOE, ParallelConfig(cp=2), "capacity dropping with cp > 1"),
])
def test_bad_layouts_are_refused(cfg, pc, match):
    with pytest.raises(ValueError, match=match):
        train(cfg, pc, steps=1, global_batch=BATCH)
