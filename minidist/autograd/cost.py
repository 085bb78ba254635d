"""Where every autograd op reports what it costs.

An op knows its floating-point operations and the bytes it moves (inputs read plus outputs
written). It reports them here; by default nobody listens. The runtime installs a hook that
charges the op to the rank's simulated compute clock with a roofline,
``max(flops / peak[dtype], bytes / hbm_bw)``, so a model written once runs both as plain numpy
and as a simulated device.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import numpy as np

#: hook(name, flops, nbytes, dtype): called once per forward op and once per backward op.
CostHook = Callable[[str, float, float, np.dtype], None]

_hook: CostHook | None = None


def set_cost_hook(hook: CostHook | None) -> CostHook | None:
    """Install ``hook`` (or None to remove it); return the previous hook."""
    global _hook
    previous, _hook = _hook, hook
    return previous


def get_cost_hook() -> CostHook | None:
    return _hook


def charge(name: str, flops: float, nbytes: float, dtype: np.dtype | type = np.float64) -> None:
    """Report one op's cost to the installed hook (a no-op when none is installed)."""
    if _hook is not None:
        _hook(name, float(flops), float(nbytes), np.dtype(dtype))


@contextmanager
def cost_hook(hook: CostHook | None):
    """Temporarily install ``hook``: ``with cost_hook(log.append_op): model(x)``."""
    previous = set_cost_hook(hook)
    try:
        yield
    finally:
        set_cost_hook(previous)
