"""Central-difference gradient checks for minidist autograd (importable by any test file).

``gradcheck(f, *inputs)`` reduces ``f``'s output to a scalar with a fixed random projection
``L = sum(f(x) * r)``, backpropagates ``r`` once, and compares every input's analytic gradient
with ``(L(x + eps e_i) - L(x - eps e_i)) / 2 eps``, one element at a time. Use float64 inputs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import minidist as md


def numeric_grad(loss: Callable[[], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """d loss / d x by central differences, perturbing ``x`` in place element by element."""
    g = np.zeros_like(x, dtype=np.float64)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        up = loss()
        flat[i] = old - eps
        down = loss()
        flat[i] = old
        gflat[i] = (up - down) / (2 * eps)
    return g


def gradcheck(f: Callable[..., md.Tensor], *inputs: md.Tensor, eps: float = 1e-6, rtol: float = 1e-6,
              atol: float = 1e-7, seed: int = 0) -> None:
    """Assert that autograd's gradients of ``f`` match central differences for every input that
    requires grad (tensors must be float64 leaves). Raises AssertionError naming the input."""
    for t in inputs:
        if isinstance(t, md.Tensor) and t.requires_grad:
            assert t.dtype == np.float64, "gradcheck needs float64 inputs"
            t.grad = None
    out = f(*inputs)
    r = np.random.default_rng(seed).standard_normal(out.shape)

    def loss() -> float:
        with md.no_grad():
            return float((f(*inputs).data * r).sum())

    out.backward(r)
    for n, t in enumerate(inputs):
        if not (isinstance(t, md.Tensor) and t.requires_grad):
            continue
        analytic = np.zeros(t.shape) if t.grad is None else t.grad
        assert analytic.shape == t.shape, f"input {n}: gradient shape {analytic.shape} != input shape {t.shape}"
        numeric = numeric_grad(loss, t.data, eps)
        np.testing.assert_allclose(analytic, numeric, rtol=rtol, atol=atol,
                                   err_msg=f"input {n} (shape {t.shape}): analytic vs central differences")
