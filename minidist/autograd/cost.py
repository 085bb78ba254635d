"""Where every autograd op reports what it costs.

An op knows its floating-point operations and the bytes it moves (inputs read plus outputs
written). It reports them here; by default nobody listens. The runtime installs a hook that
charges the op to the rank's simulated compute clock (the roofline,
``max(flops / peak[dtype], bytes / hbm_bw)``, or a measured device's kernels: ``hardware/kernels.py``),
so a model written once runs both as plain numpy and as a simulated device.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import contextmanager

import numpy as np

#: hook(name, flops, nbytes, dtype, shape): called once per forward op and once per backward op. ``shape`` says
#: what the counts alone do not, for a device that prices kernels by their shape: ``(batch, m, k, n)`` for a
#: matrix product, ``(batch_heads, tq, tk, d, dv)`` for attention, the input's shape for a softmax or a norm,
#: ``()`` for the rest.
CostHook = Callable[[str, float, float, np.dtype, tuple], None]

_hook: CostHook | None = None


def _takes_shape(hook: Callable) -> bool:
    try:
        inspect.signature(hook).bind("op", 0.0, 0.0, np.dtype(np.float64), ())
    except TypeError:
        return False
    except ValueError:  # a builtin without a signature: assume the current protocol
        return True
    return True


def set_cost_hook(hook: CostHook | None) -> CostHook | None:
    """Install ``hook`` (or None to remove it); return the previous hook. A hook written for the older
    protocol, ``hook(name, flops, nbytes, dtype)``, is called without the shape."""
    global _hook
    if hook is not None and not _takes_shape(hook):
        four = hook

        def hook(name, flops, nbytes, dtype, shape=()):
            four(name, flops, nbytes, dtype)

    previous, _hook = _hook, hook
    return previous


def get_cost_hook() -> CostHook | None:
    return _hook


def charge(name: str, flops: float, nbytes: float, dtype: np.dtype | type = np.float64, shape: tuple = ()) -> None:
    """Report one op's cost to the installed hook (a no-op when none is installed)."""
    if _hook is not None:
        _hook(name, float(flops), float(nbytes), np.dtype(dtype), shape)


@contextmanager
def cost_hook(hook: CostHook | None):
    """Temporarily install ``hook``: ``with cost_hook(log.append_op): model(x)``."""
    previous = set_cost_hook(hook)
    try:
        yield
    finally:
        set_cost_hook(previous)
