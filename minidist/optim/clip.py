"""Gradient clipping by global norm: rescale all gradients together so their joint L2 norm is at most max_norm.

The norm is over every parameter at once, so under sharding it needs one all-reduce of the
squared partial norms before any rank can clip (the reason it is one function, not per-tensor).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from minidist.optim.optimizer import grad_array


def global_grad_norm(params: Iterable) -> float:
    """sqrt of the sum of squares of every gradient, accumulated in float64."""
    total = 0.0
    for p in params:
        g = grad_array(p)
        if g is not None:
            g = g.ravel()
            total += float(np.dot(g, g)) if g.dtype == np.float64 else float(np.dot(g.astype(np.float64), g))
    return float(np.sqrt(total))


def clip_grad_norm_(params: Iterable, max_norm: float, eps: float = 1e-6) -> float:
    """Scale gradients in place by ``min(1, max_norm / (norm + eps))``; return the norm before clipping."""
    if max_norm <= 0:
        raise ValueError(f"clip_grad_norm_: max_norm must be > 0, got {max_norm}")
    params = list(params)
    norm = global_grad_norm(params)
    scale = max_norm / (norm + eps)
    if scale < 1.0:
        for p in params:
            g = grad_array(p)
            if g is not None:
                g *= scale
    return norm
