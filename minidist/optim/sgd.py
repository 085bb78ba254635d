"""Stochastic gradient descent with momentum and Nesterov momentum, in PyTorch's form.

With momentum mu the buffer is ``b = mu * b + g`` (the first step sets ``b = g``) and the update
``p -= lr * b``, or ``p -= lr * (g + mu * b)`` with Nesterov. Weight decay here is L2: it is added
to the gradient before the buffer. State per parameter: ``{"momentum_buffer": array}`` when
momentum is on, nothing otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from minidist.optim.optimizer import Optimizer


def sgd_update_(param: np.ndarray, grad: np.ndarray, buf: np.ndarray | None, *, lr: float, momentum: float = 0.0,
                weight_decay: float = 0.0, nesterov: bool = False) -> np.ndarray | None:
    """Update ``param`` in place; return the new momentum buffer (None without momentum)."""
    d = grad + weight_decay * param if weight_decay else grad
    if momentum:
        if buf is None:
            buf = d.astype(param.dtype, copy=True)
        else:
            buf *= momentum
            buf += d
        d = d + momentum * buf if nesterov else buf
    param -= lr * d
    return buf


class SGD(Optimizer):
    def __init__(self, params: Iterable, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD: lr, momentum and weight_decay must be >= 0, got {lr}, {momentum}, {weight_decay}")
        if nesterov and momentum == 0:
            raise ValueError("SGD: nesterov=True needs momentum > 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov))

    def _update(self, group, index, p, g):
        state = self.state.setdefault(index, {})
        buf = sgd_update_(p.data, g, state.get("momentum_buffer"), lr=group["lr"], momentum=group["momentum"],
                          weight_decay=group["weight_decay"], nesterov=group["nesterov"])
        if buf is not None:
            state["momentum_buffer"] = buf
