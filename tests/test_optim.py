"""SGD, AdamW, clipping and schedules against hand-written numpy references."""

import math

import numpy as np
import pytest

from minidist import optim


class P:
    """The smallest thing an optimizer accepts: .data and .grad."""

    def __init__(self, data):
        self.data = np.array(data)
        self.grad = None


def make_params(dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return [P(rng.standard_normal((3, 4)).astype(dtype)), P(rng.standard_normal(5).astype(dtype))]


def grads_for(step, params, seed=1):
    # Gradients that depend on the weights and the step, so errors in state handling show up.
    rng = np.random.default_rng(seed + step)
    return [(0.5 * p.data + rng.standard_normal(p.data.shape)).astype(p.data.dtype) for p in params]


def run(opt, params, steps):
    for t in range(steps):
        for p, g in zip(params, grads_for(t, params)):
            p.grad = g
        opt.step()


@pytest.mark.parametrize("momentum,nesterov,wd", [(0.0, False, 0.0), (0.9, False, 0.0), (0.9, True, 0.1),
                                                  (0.5, False, 0.01)])
def test_sgd_matches_reference(momentum, nesterov, wd):
    params, ref = make_params(), make_params()
    run(optim.SGD(params, lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=wd), params, 5)
    bufs = [None, None]
    for t in range(5):
        gs = grads_for(t, ref)
        for k, (p, g) in enumerate(zip(ref, gs)):
            d = g + wd * p.data
            if momentum:
                bufs[k] = d.copy() if bufs[k] is None else momentum * bufs[k] + d
                d = d + momentum * bufs[k] if nesterov else bufs[k]
            p.data = p.data - 0.1 * d
    for p, r in zip(params, ref):
        np.testing.assert_allclose(p.data, r.data, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-6)])
def test_adamw_matches_reference(dtype, tol):
    lr, b1, b2, eps, wd = 0.01, 0.9, 0.95, 1e-8, 0.1
    params, ref = make_params(dtype), make_params(np.float64)
    opt = optim.AdamW(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    run(opt, params, 7)
    m = [np.zeros_like(p.data) for p in ref]
    v = [np.zeros_like(p.data) for p in ref]
    for t in range(1, 8):
        gs = grads_for(t - 1, ref)
        for k, (p, g) in enumerate(zip(ref, gs)):
            g = g.astype(dtype).astype(np.float64)  # the same gradient the optimizer saw
            p.data = p.data * (1 - lr * wd)
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * g**2
            mhat, vhat = m[k] / (1 - b1**t), v[k] / (1 - b2**t)
            p.data = p.data - lr * mhat / (np.sqrt(vhat) + eps)
    for i, (p, r) in enumerate(zip(params, ref)):
        assert p.data.dtype == dtype
        assert opt.state[i]["m"].dtype == dtype and opt.state[i]["step"] == 7
        np.testing.assert_allclose(opt.state[i]["m"], m[i], rtol=tol * 10, atol=tol)
        np.testing.assert_allclose(p.data, r.data, rtol=tol, atol=tol)


def test_adamw_first_step_moves_each_weight_by_lr():
    # With bias correction, step one is lr * g / (|g| + eps): a signed step of size ~lr, whatever the scale of g.
    p = P(np.zeros(4))
    p.grad = np.array([1e-3, -5.0, 2e4, -1e-2])
    optim.AdamW([p], lr=0.1, weight_decay=0.0).step()
    np.testing.assert_allclose(p.data, -0.1 * np.sign(p.grad), rtol=1e-4)


def test_params_without_grad_are_skipped_and_zero_grad():
    a, b = make_params()
    b0 = b.data.copy()
    a.grad = np.ones_like(a.data)
    opt = optim.AdamW([a, b], lr=0.1)
    opt.step()
    np.testing.assert_array_equal(b.data, b0)
    assert 1 not in opt.state and 0 in opt.state
    opt.zero_grad()
    assert a.grad is None


def test_param_groups_and_state_dict_round_trip():
    params = make_params()
    opt = optim.AdamW([{"params": [params[0]]}, {"params": [params[1]], "weight_decay": 0.0}], lr=0.01)
    assert opt.param_groups[0]["weight_decay"] == 0.01 and opt.param_groups[1]["weight_decay"] == 0.0
    run(opt, params, 3)
    sd = opt.state_dict()
    twin_params = [P(q.data.copy()) for q in params]
    twin = optim.AdamW([{"params": [twin_params[0]]}, {"params": [twin_params[1]], "weight_decay": 0.0}], lr=0.5)
    twin.load_state_dict(sd)
    assert twin.param_groups[0]["lr"] == 0.01
    sd["state"][0]["m"][:] = 123.0  # the loaded state is a copy
    assert not np.any(twin.state[0]["m"] == 123.0)
    # Continuing from the loaded state gives the same weights as continuing the original.
    for t in range(3, 5):
        for opt_, ps in ((opt, params), (twin, twin_params)):
            for p, g in zip(ps, grads_for(t, ps)):
                p.grad = g
            opt_.step()
    for p, q in zip(params, twin_params):
        np.testing.assert_array_equal(p.data, q.data)


def test_bad_arguments():
    with pytest.raises(ValueError, match="empty"):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD(make_params(), lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="betas"):
        optim.AdamW(make_params(), betas=(0.9, 1.0))
    p = P(np.zeros(3))
    p.grad = np.zeros(4)
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        optim.SGD([p], lr=0.1).step()


def test_clip_grad_norm():
    params = make_params()
    for p in params:
        p.grad = np.full_like(p.data, 2.0)
    n = 12 + 5
    expected = math.sqrt(n * 4.0)
    total = optim.clip_grad_norm_(params, max_norm=1.0)
    assert total == pytest.approx(expected)
    assert optim.global_grad_norm(params) == pytest.approx(1.0, rel=1e-5)
    # Below the threshold nothing changes.
    before = [p.grad.copy() for p in params]
    assert optim.clip_grad_norm_(params, max_norm=10.0) == pytest.approx(1.0, rel=1e-5)
    for p, b in zip(params, before):
        np.testing.assert_array_equal(p.grad, b)


def test_warmup_cosine():
    f = lambda s: optim.warmup_cosine(s, warmup=10, total=110, lr_max=1.0, lr_min=0.1)  # noqa: E731
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.55)  # half way down the cosine
    assert f(110) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)
    lrs = [f(s) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    with pytest.raises(ValueError):
        optim.warmup_cosine(0, warmup=5, total=3, lr_max=1.0)


def test_lr_scheduler_drives_the_optimizer():
    params = make_params()
    opt = optim.SGD(params, lr=123.0)
    sched = optim.LRScheduler(opt, lambda s: optim.warmup_cosine(s, 2, 10, 1.0, 0.0))
    seen = []
    for _ in range(4):
        seen.append(opt.param_groups[0]["lr"])
        sched.step()
    assert seen == pytest.approx([0.5, 1.0, 1.0, optim.warmup_cosine(3, 2, 10, 1.0, 0.0)])
    assert sched.get_last_lr() == pytest.approx(optim.warmup_cosine(4, 2, 10, 1.0, 0.0))
    again = optim.LRScheduler(optim.SGD(make_params(), lr=9.0), sched.schedule)
    again.load_state_dict(sched.state_dict())
    assert again.get_last_lr() == sched.get_last_lr()
