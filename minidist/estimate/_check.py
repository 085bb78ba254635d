"""Input validation shared by the estimate modules: every error names the function and the argument."""

from __future__ import annotations

import functools
import inspect
import math
import numbers


def nonnegative(fn: str, name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value) or value < 0:
        raise ValueError(f"{fn}: {name} must be a number >= 0, got {value!r}")
    return value


def positive(fn: str, name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value) or value <= 0:
        raise ValueError(f"{fn}: {name} must be a number > 0, got {value!r}")
    return value


def fraction(fn: str, name: str, value: float, *, open_low: bool = False) -> float:
    """A value in [0, 1] (or (0, 1] with ``open_low``)."""
    ok = isinstance(value, (int, float)) and not math.isnan(value) and (value > 0 if open_low else value >= 0)
    if not ok or value > 1:
        lo = "(0" if open_low else "[0"
        raise ValueError(f"{fn}: {name} must be in {lo}, 1], got {value!r}")
    return value


def count(fn: str, name: str, value: int, minimum: int = 1) -> int:
    """An integer >= minimum (floats equal to an integer are accepted)."""
    bad = isinstance(value, bool) or not isinstance(value, (int, float))
    if bad or not math.isfinite(value) or value != int(value) or value < minimum:
        raise ValueError(f"{fn}: {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def choice(fn: str, name: str, value, options) -> object:
    if value not in options:
        raise ValueError(f"{fn}: unknown {name} {value!r}; expected one of {sorted(map(str, options))}")
    return value


def finite_numbers(fn):
    """Wrap a public function so that a NaN or infinite number among its arguments is refused by name.

    The formulas would otherwise return NaN, or fail deep inside with ZeroDivisionError or OverflowError
    that name neither the function nor the argument. Applied once to every exported function (see
    ``__init__.py``); the modules call each other unwrapped, so the planner's inner loops pay nothing.
    """
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        for name, value in sig.bind(*args, **kwargs).arguments.items():
            for v in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(v, numbers.Real) and not isinstance(v, bool) and not math.isfinite(v):
                    raise ValueError(f"{fn.__name__}: {name} must be a finite number, got {value!r}")
        return fn(*args, **kwargs)

    return checked
