"""The mixture-of-experts layer (chapter 18, lab 12): routing, capacity, losses, gradients, GPT hook.

The oracle is a per-token loop written as plainly as possible: each token goes to its top-k
experts in decreasing probability; experts serve first choices before second choices and earlier
tokens first, up to their capacity; the output is the gate-weighted sum of the surviving experts'
outputs (plus the shared expert).
"""

import math

import numpy as np
import pytest

import minidist as md
from minidist.nn.moe import MoE, expert_capacity, keep_mask, level_counts, quotas, top_k_experts
from tests.gradcheck import gradcheck

D, FF = 8, 12
TOL = dict(rtol=1e-12, atol=1e-13)


def _moe(E=4, k=2, cf=None, shared=False, seed=0, **kw):
    return MoE(D, FF, E, top_k=k, capacity_factor=cf, shared_expert=shared, rng=seed, dtype="float64", **kw)


def _reference(moe: MoE, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-token loop: (output, (N, k) kept mask)."""
    xf = x.reshape(-1, D)
    N, E, k = len(xf), moe.n_experts, moe.top_k
    logits = xf @ moe.router.weight.data
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    choice = [sorted(range(E), key=lambda e: (-p[n, e], e))[:k] for n in range(N)]
    cap = math.inf if moe.capacity_factor is None else math.ceil(moe.capacity_factor * N * k / E)
    used = [0] * E
    keep = np.zeros((N, k), bool)
    for j in range(k):
        for n in range(N):
            e = choice[n][j]
            if used[e] < cap:
                used[e] += 1
                keep[n, j] = True
    y = np.zeros_like(xf)
    for n in range(N):
        g = np.array([p[n, e] for e in choice[n]])
        if moe.renormalize:
            g = g / g.sum()
        for j, e in enumerate(choice[n]):
            if keep[n, j]:
                y[n] += g[j] * moe.experts[e](md.tensor(xf[n:n + 1])).data[0]
        if moe.shared is not None:
            y[n] += moe.shared(md.tensor(xf[n:n + 1])).data[0]
    return y.reshape(x.shape), keep


@pytest.mark.parametrize("E,k,cf,shared", [(4, 1, None, False), (4, 2, None, True), (4, 1, 1.0, False),
                                           (8, 2, 1.25, False), (8, 2, 0.5, True), (4, 2, 1.0, False)])
def test_moe_equals_the_per_token_loop(E, k, cf, shared):
    moe = _moe(E, k, cf, shared)
    x = np.random.default_rng(1).normal(size=(3, 7, D))
    y = moe(md.tensor(x))
    ref, keep = _reference(moe, x)
    np.testing.assert_allclose(y.data, ref, **TOL)
    assert moe.stats["dropped"] == int((~keep).sum())
    if cf is not None and cf < 1:
        assert moe.stats["dropped"] > 0  # the case really exercises dropping
        assert (moe.stats["kept"] <= moe.stats["capacity"]).all()


def test_gates_are_renormalised_for_top2_and_raw_for_top1():
    x = md.tensor(np.random.default_rng(2).normal(size=(5, D)))
    for k, renorm in ((2, True), (1, False)):
        moe = _moe(k=k)
        assert moe.renormalize is renorm
    moe = _moe(k=2, renormalize=False)
    ref, _ = _reference(moe, x.data)
    np.testing.assert_allclose(moe(x).data, ref, **TOL)


def test_top_k_breaks_ties_towards_the_lower_expert():
    p = np.array([[0.25, 0.25, 0.25, 0.25], [0.1, 0.4, 0.4, 0.1]])
    np.testing.assert_array_equal(top_k_experts(p, 2), [[0, 1], [1, 2]])


def test_capacity_formula_and_quotas():
    assert expert_capacity(100, 8, 2, 1.25) == md.estimate.expert_capacity(100, 8, 1.25, 2) == 32
    assert expert_capacity(100, 8, 2, None) is None
    # two ranks, two choices, one expert of capacity 5: rank 0 first choices, rank 1 first, then seconds
    counts = np.array([[[3], [2]], [[1], [4]]])  # (rank, choice, expert)
    np.testing.assert_array_equal(quotas(counts, 5)[..., 0], [[3, 1], [1, 0]])
    np.testing.assert_array_equal(quotas(counts, None), counts)


def test_keep_mask_keeps_earliest_tokens_per_choice():
    experts = np.array([[0, 1], [0, 1], [1, 0], [0, 1]])
    kept = np.array([[2, 1], [1, 0]])  # (choice, expert)
    np.testing.assert_array_equal(keep_mask(experts, kept),
                                  [[True, False], [True, False], [True, True], [False, False]])
    np.testing.assert_array_equal(level_counts(experts, 2), [[3, 1], [1, 3]])


def test_aux_loss_is_one_at_uniform_routing_and_E_when_collapsed():
    x = md.tensor(np.random.default_rng(3).normal(size=(16, D)))
    moe = _moe(E=4, k=1, aux_loss_coef=1.0, z_loss_coef=0.0)
    moe.router.weight.data[:] = 0  # every probability 1/E
    moe(x)
    assert float(moe.aux_loss.data) == pytest.approx(1.0)
    xc = md.tensor(np.concatenate([np.ones((16, 1)), x.data[:, 1:]], axis=1))
    moe.router.weight.data[0, 0] = 50.0  # feature 0 is 1 for every token: all pick expert 0 with p ~ 1
    moe(xc)
    assert float(moe.aux_loss.data) == pytest.approx(4.0, rel=1e-6)


def test_z_loss_is_the_mean_squared_logsumexp():
    x = md.tensor(np.random.default_rng(4).normal(size=(6, D)))
    moe = _moe(aux_loss_coef=0.0, z_loss_coef=1.0)
    moe(x)
    logits = x.data @ moe.router.weight.data
    lse = np.log(np.exp(logits).sum(-1))
    assert float(moe.aux_loss.data) == pytest.approx(np.mean(lse ** 2), rel=1e-12)


@pytest.mark.parametrize("k,cf,shared", [(1, None, False), (2, 1.0, True)])
def test_gradients_match_central_differences(k, cf, shared):
    moe = _moe(E=4, k=k, cf=cf, shared=shared, seed=5)
    x = md.tensor(np.random.default_rng(6).normal(size=(6, D)), requires_grad=True)
    params = [moe.router.weight, moe.experts[1].fc1.weight, moe.experts[2].fc2.bias]

    def f(x, *_):
        y = moe(x)
        return y.sum() * 0.1 + moe.aux_loss + (y * y).sum()

    gradcheck(f, x, *params, rtol=1e-5, atol=1e-7)


def test_gpt_with_experts_trains_and_dense_default_is_unchanged():
    dense = md.GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_layers=2, n_heads=2, dtype="float64")
    assert dense.n_experts == 0
    assert not any(isinstance(m, MoE) for m in md.GPT(dense).modules())
    cfg = md.GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_layers=2, n_heads=2, n_experts=4, top_k=2,
                       capacity_factor=1.5, shared_expert=True, dtype="float64")
    model = md.GPT(cfg, seed=0)
    assert isinstance(model.blocks[0].mlp, MoE) and model.blocks[0].mlp.shared is not None
    opt = md.optim.AdamW(model.parameters(), lr=3e-3)
    idx = np.random.default_rng(7).integers(0, 32, (4, 8))
    losses = []
    for _ in range(10):
        opt.zero_grad()
        logits, loss = model(idx[:, :-1], idx[:, 1:])
        ce = md.autograd.functional.cross_entropy(logits.reshape(-1, 32), idx[:, 1:].reshape(-1))
        aux = sum(float(b.mlp.aux_loss.data) for b in model.blocks)
        assert float(loss.data) == pytest.approx(float(ce.data) + aux, rel=1e-12)
        loss.backward()
        assert np.abs(model.blocks[0].mlp.router.weight.grad).sum() > 0
        opt.step()
        losses.append(float(loss.data))
    assert losses[-1] < losses[0] - 0.1


def test_errors():
    with pytest.raises(ValueError, match="top_k <= n_experts"):
        _moe(E=2, k=3)
    with pytest.raises(ValueError, match="capacity_factor must be > 0"):
        _moe(cf=0)
    with pytest.raises(ValueError, match="GPTConfig: need n_experts"):
        md.GPTConfig(vocab_size=8, seq_len=4, d_model=8, n_layers=1, n_heads=1, n_experts=2, top_k=3)
    with pytest.raises(ValueError, match="MoE: expected input"):
        _moe()(md.tensor(np.zeros(D)))


def test_routing_by_plan_deals_the_given_load():
    from minidist.nn.moe import planned_experts

    even = planned_experts(10, 4, 2, "balanced")
    assert even.shape == (10, 2) and (even[:, 0] != even[:, 1]).all()
    assert np.bincount(even.ravel(), minlength=4).tolist() == [5, 5, 5, 5]
    skew = planned_experts(10, 4, 2, (0.4, 0.3, 0.2, 0.1))
    assert np.bincount(skew.ravel(), minlength=4).tolist() == [8, 6, 4, 2] and (skew[:, 0] != skew[:, 1]).all()
    # largest remainders: 3.5, 1.75, 1.75 -> 3, 2, 2
    assert np.bincount(planned_experts(7, 3, 1, (0.5, 0.25, 0.25)).ravel()).tolist() == [3, 2, 2]
    with pytest.raises(ValueError, match="no share may exceed 1/top_k"):
        planned_experts(10, 4, 2, (0.7, 0.1, 0.1, 0.1))
    for bad in ("even", (0.5, 0.5), (0.5, 0.5, 0.5, -0.5)):
        with pytest.raises(ValueError, match="expert_load must be 'balanced' or"):
            MoE(8, 16, 4, top_k=2, expert_load=bad, rng=0)


def test_a_model_routed_by_plan_trains_and_reports_the_plan():
    cfg = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=1, n_heads=4, n_experts=4, top_k=2,
                       expert_load=(0.4, 0.3, 0.2, 0.1))
    run = md.parallel.train(cfg, md.parallel.ParallelConfig(ep=2), steps=3, global_batch=4)
    assert np.isfinite(run.losses).all()
    model = md.GPT(cfg, seed=0)
    model(np.zeros((2, 8), dtype=np.int64))
    assert model.blocks[0].mlp.stats["load"].tolist() == [13, 10, 6, 3]  # 0.4, 0.3, 0.2, 0.1 of 16 x 2
