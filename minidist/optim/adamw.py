"""AdamW: Adam's moment estimates with weight decay decoupled from the gradient (Loshchilov & Hutter).

At step t (from 1), with gradient g:

    p <- p * (1 - lr * wd)                    decay acts on the weight, not through m and v
    m <- beta1 * m + (1 - beta1) * g
    v <- beta2 * v + (1 - beta2) * g**2
    p <- p - lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)

This is PyTorch's order of operations, eps included after the bias correction of v. State per
parameter: ``{"step": int, "m": array, "v": array}`` in the parameter's dtype: two extra copies of
the model, the 8 bytes per parameter (fp32) that the memory equation and ZeRO count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from minidist.autograd.fused import blockwise
from minidist.optim.optimizer import Optimizer


def adamw_update_(param: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray, step: int, *, lr: float,
                  beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0) -> None:
    """One AdamW step on arrays, in place on ``param``, ``m`` and ``v``; ``step`` counts from 1."""
    decay = 1.0 - lr * weight_decay
    v_scale = math.sqrt(1.0 - beta2**step)
    step_size = lr / (1.0 - beta1**step)

    # The step is pure memory traffic: fourteen in-place passes with one scratch array, run on
    # cache-sized blocks (fused.blockwise) so that only the first pass over a block reads memory.
    def kernel(p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray) -> None:
        if weight_decay:
            p *= decay
        m *= beta1
        tmp = np.multiply(g, 1.0 - beta1, dtype=p.dtype)
        m += tmp
        v *= beta2
        np.multiply(g, g, out=tmp)
        tmp *= 1.0 - beta2
        v += tmp
        np.sqrt(v, out=tmp)
        tmp /= v_scale
        tmp += eps
        np.divide(m, tmp, out=tmp)
        tmp *= step_size
        p -= tmp

    blockwise(kernel, param, grad, m, v)


class AdamW(Optimizer):
    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"AdamW: lr, eps and weight_decay must be >= 0, got {lr}, {eps}, {weight_decay}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"AdamW: betas must lie in [0, 1), got {betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    def _update(self, group, index, p, g):
        state = self.state.get(index)
        if state is None:
            state = self.state[index] = {"step": 0, "m": np.zeros_like(p.data), "v": np.zeros_like(p.data)}
        state["step"] += 1
        beta1, beta2 = group["betas"]
        adamw_update_(p.data, g, state["m"], state["v"], state["step"], lr=group["lr"], beta1=beta1, beta2=beta2,
                      eps=group["eps"], weight_decay=group["weight_decay"])
