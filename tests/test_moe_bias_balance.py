"""Auxiliary-loss-free balancing: the routing biases choose experts without weighting them, move towards the mean
load after every step, balance a router that starts lopsided, and move the same way on every layout."""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
from minidist.nn.moe import MoE, update_route_bias
from minidist.parallel import ParallelConfig, Resilience, train


def test_the_bias_chooses_but_does_not_weight():
    moe = MoE(8, 16, 4, top_k=1, balance="bias", rng=0, dtype="float64")
    x = md.Tensor(np.random.default_rng(1).standard_normal((32, 8)))
    y0 = moe(x).data
    probs = md.autograd.functional.softmax(moe.router(x), axis=-1).data
    moe.route_bias = np.array([0.0, 0.0, 0.0, 10.0])  # every token now picks expert 3 ...
    y1 = moe(x).data
    assert (moe.stats["load"] == [0, 0, 0, 32]).all()
    want = moe.experts[3](x).data * probs[:, 3:4]  # ... with its own probability as the gate, not 10 + p
    assert np.allclose(y1, want, rtol=0, atol=1e-12) and not np.allclose(y0, y1)


def test_the_biases_move_towards_the_mean_load():
    moe = MoE(8, 16, 4, top_k=2, balance="bias", bias_update=0.01, rng=0)
    moe.stats = {"load": np.array([10, 2, 4, 0])}  # mean 4
    update_route_bias(moe)
    assert np.allclose(moe.route_bias, [-0.01, 0.01, 0.0, 0.01])


def test_bias_balancing_evens_out_a_lopsided_start():
    cfg = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=1, n_heads=2, n_experts=4, top_k=1,
                       aux_loss_coef=0.0, moe_balance="bias", dtype="float64")
    tokens = md.data.load_tokens(4000, seed=0)[0]
    imbalance = {}
    for speed in (0.0, 0.02):  # 0: the biases stay where they start
        model = md.GPT(md.GPTConfig(**{**cfg.__dict__, "bias_update": speed}), seed=0)
        moe = model.blocks[0].mlp
        moe.route_bias = np.array([0.5, 0.0, 0.0, 0.0])  # every token starts on expert 0
        rng, late = np.random.default_rng(0), np.zeros(4)
        for step in range(80):
            x, y = md.data.get_batch(tokens, 8, cfg.seq_len, rng)
            model(x, y)  # no training: only the biases change, so any evening out is theirs
            update_route_bias(model)
            if step >= 40:  # the load over the last 40 batches: one batch of 64 tokens is noisy
                late += moe.stats["load"]
        imbalance[speed] = late.max() / late.mean()
    assert imbalance[0.0] == 4 and imbalance[0.02] < 1.3, imbalance


@pytest.mark.parametrize("pc", [ParallelConfig(dp=2), ParallelConfig(dp=2, ep=2)], ids=["dp2", "dp2-ep2"])
def test_every_rank_moves_the_biases_alike_and_training_equals_one_device(pc):
    cfg = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2, n_experts=4, top_k=2,
                       aux_loss_coef=0.0, moe_balance="bias", bias_update=0.05)
    one = train(cfg, ParallelConfig(), steps=4, global_batch=8)
    got = train(cfg, pc, steps=4, global_batch=8)
    assert max(abs(a - b) for a, b in zip(got.losses, one.losses)) < 1e-10
    assert max(float(np.abs(got.params[k] - one.params[k]).max()) for k in one.params) < 1e-10


def test_a_run_resumed_from_a_checkpoint_routes_by_the_saved_biases(tmp_path):
    # (more layouts and a restart after a failure: tests/test_checkpoint_loop_state.py)
    cfg = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=1, n_heads=2, n_experts=4,
                       aux_loss_coef=0.0, moe_balance="bias", bias_update=0.05)
    ref = train(cfg, ParallelConfig(), steps=4, global_batch=4)
    train(cfg, ParallelConfig(), steps=2, global_batch=4, resilience=Resilience(tmp_path, every=1))
    got = train(cfg, ParallelConfig(), steps=4, global_batch=4, resilience=Resilience(tmp_path, resume=True))
    assert got.losses == ref.losses and all(np.array_equal(got.params[k], ref.params[k]) for k in ref.params)


def test_moe_balance_is_checked():
    with pytest.raises(ValueError, match="moe_balance must be one of"):
        md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=1, n_heads=2, n_experts=4, moe_balance="x")
