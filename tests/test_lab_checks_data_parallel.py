"""Lab 08 checks accept the right answers and reject the typical wrong ones with the intended hint."""

import numpy as np
import pytest

import minidist as md
from minidist.labs import CheckFailed


def _local_grad(w, x, y):
    return 2.0 * x.T @ (x @ w - y) / len(y)


def dp_good(w, x, y, global_batch):
    wt = md.tensor(w, requires_grad=True)
    loss = ((md.tensor(x) @ wt - md.tensor(y)) ** 2).mean()
    (loss * (len(y) / global_batch)).backward()
    g = wt.grad.copy()
    md.dist.all_reduce(g)
    return g


def dp_numpy(w, x, y, global_batch):  # no autograd: the check only needs the right numbers
    g = _local_grad(w, x, y) * len(y) / global_batch
    md.dist.all_reduce(g)
    return g


def dp_equal_mean(w, x, y, global_batch):
    g = _local_grad(w, x, y)
    md.dist.all_reduce(g)
    return g / md.dist.get_world_size()


def dp_sum_of_means(w, x, y, global_batch):
    g = _local_grad(w, x, y)
    md.dist.all_reduce(g)
    return g


def dp_no_reduce(w, x, y, global_batch):
    return _local_grad(w, x, y) * len(y) / global_batch


def dp_todo(w, x, y, global_batch):
    raise NotImplementedError


def test_dp_gradient_accepts_autograd_and_numpy(capsys):
    md.labs.check_dp_gradient(dp_good)
    md.labs.check_dp_gradient(dp_numpy)
    assert capsys.readouterr().out.count("ok: dp_gradient") == 2


@pytest.mark.parametrize("fn, match", [
    (dp_equal_mean, r"(?s)on 3 ranks.*equal average.*\[4, 3, 3\]"),
    (dp_sum_of_means, r"(?s)on 2 ranks.*2 times too big"),
    (dp_no_reduce, r"(?s)on 2 ranks.*md.dist.all_reduce"),
    (dp_todo, "not done yet"),
])
def test_dp_gradient_rejects_typical_mistakes(fn, match):
    with pytest.raises(CheckFailed, match=match):
        md.labs.check_dp_gradient(fn)


def ring(n, p, a, b):
    return 2 * (p - 1) * a + 2 * (p - 1) / p * n / b


def test_bucketed_time():
    md.labs.check_bucketed_time(lambda n, k, p, a, b: k * ring(n / k, p, a, b))
    for wrong, match in [(lambda n, k, p, a, b: ring(n, p, a, b), "its own latency"),
                         (lambda n, k, p, a, b: k * ring(n, p, a, b), "n/k bytes"),
                         (lambda n, k, p, a, b: k * ring(n / k, p, a, b) / 2, "2\\(p-1\\) steps"),
                         (lambda n, k, p, a, b: None, "return")]:
        with pytest.raises(CheckFailed, match=match):
            md.labs.check_bucketed_time(wrong)


def test_dp_min_tokens():
    md.labs.check_dp_min_tokens(lambda f, b, s: f * s / (3 * b))
    assert np.isclose(989e12 * 2 / (3 * 900e9), 732.6, rtol=1e-4)  # the book's "b > 733"
    for wrong, match in [(lambda f, b, s: 3 * b / (f * s), "upside down"),
                         (lambda f, b, s: f * s / b, "6 Psi"),
                         (lambda f, b, s: f * s / (6 * b), "2 Psi s bytes"),
                         (lambda f, b, s: f / (3 * b), "bytes_per_grad")]:
        with pytest.raises(CheckFailed, match=match):
            md.labs.check_dp_min_tokens(wrong)


def test_exposed_comm_accepts_the_walk_and_names_each_usual_mistake():
    from functools import partial

    from minidist.labs.data_parallel_checks import _exposed

    md.labs.check_exposed_comm(_exposed)
    for flag, words in [("overlap", "while the backward goes on"), ("serial", "one all-reduce at a time"),
                        ("minus_end", "after the backward finished")]:
        with pytest.raises(CheckFailed, match=words):
            md.labs.check_exposed_comm(partial(_exposed, **{flag: False}))
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_exposed_comm(lambda *a: (_ for _ in ()).throw(NotImplementedError))
