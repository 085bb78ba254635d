"""A GPT trained with context parallelism equals the single-device GPT (chapter 17, lab 11).

Each rank holds its positions of every sequence; the weights are replicated and their gradients
averaged over the cp group. Three AdamW steps in float64: the loss every step, the gradients and
the weights after the last step match the one-device run.
"""

import numpy as np
import pytest

import minidist as md
from minidist.parallel.context import context_parallel as cpm

CFG = md.GPTConfig(vocab_size=40, seq_len=16, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, dtype="float64")
STEPS, BATCH = 3, 2
TOL = dict(rtol=1e-9, atol=1e-12)


def _batches():
    tokens, _ = md.data.load_tokens(4000, seed=0)
    rng = np.random.default_rng([0, 2])
    return [md.data.get_batch(tokens % CFG.vocab_size, BATCH, CFG.seq_len, rng) for _ in range(STEPS)]


def _one_device():
    model = md.GPT(CFG, seed=0)
    opt = md.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    losses = []
    for x, y in _batches():
        opt.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        grads = {n: p.grad.copy() for n, p in model.named_parameters()}
        opt.step()
        losses.append(float(loss.data))
    return losses, grads, {n: p.data.copy() for n, p in model.named_parameters()}


def _rank(method, layout):
    from minidist import dist

    cp = cpm.CPGroup.of(None, layout)
    model = cpm.context_parallelize(md.GPT(CFG, seed=0), cp, method)
    opt = md.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    losses = []
    for x, y in _batches():
        opt.zero_grad()
        _, loss = cpm.forward(model, cp.shard(x), cp.shard(y), cp)
        loss.backward()
        for p in model.parameters():  # the global loss is the mean of the ranks' equal-sized shares
            dist.all_reduce(p.grad)
            p.grad /= cp.size
        grads = {n: p.grad.copy() for n, p in model.named_parameters()}
        opt.step()
        total = np.array([float(loss.data)])
        dist.all_reduce(total)
        losses.append(total[0] / cp.size)
    return losses, grads, {n: p.data.copy() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def oracle():
    return _one_device()


@pytest.mark.parametrize("method,layout,p", [("ring", "zigzag", 2), ("ring", "contiguous", 4), ("ring", "zigzag", 4),
                                             ("ulysses", "contiguous", 2), ("ulysses", "zigzag", 4)])
def test_gpt_with_context_parallelism_trains_like_one_device(oracle, method, layout, p):
    ref_losses, ref_grads, ref_params = oracle
    res = md.launch(_rank, world_size=p, args=(method, layout))
    for losses, grads, params in res:
        np.testing.assert_allclose(losses, ref_losses, **TOL)
        for name in ref_params:
            np.testing.assert_allclose(grads[name], ref_grads[name], err_msg=name, **TOL)
            np.testing.assert_allclose(params[name], ref_params[name], err_msg=name, **TOL)
    assert ref_losses[-1] < ref_losses[0]


def test_context_parallelize_rejects_unknown_method():
    with pytest.raises(ValueError, match="method must be one of"):
        cpm.context_parallelize(md.GPT(CFG), cpm.CPGroup(), "striped")
