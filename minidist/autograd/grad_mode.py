"""Grad mode: whether new operations are recorded for backward.

Recording the graph is what costs memory (each op keeps the inputs its backward needs alive), so
evaluation, optimizer updates and the forward half of recomputation (chapter 21) turn it off.
``no_grad`` and ``enable_grad`` work both as context managers and as decorators.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

# Read directly (``grad_mode._enabled``) by every op: an attribute load is the cheapest check.
_enabled: bool = True


def is_grad_enabled() -> bool:
    """True when operations on tensors that require grad are being recorded."""
    return _enabled


def set_grad_enabled(mode: bool) -> bool:
    """Turn recording on or off; return the previous setting."""
    global _enabled
    previous, _enabled = _enabled, bool(mode)
    return previous


class _GradMode:
    _mode: bool

    def __new__(cls, fn: Callable | None = None):
        self = super().__new__(cls)
        if fn is None:
            return self
        self.__init__()
        return self(fn)  # bare decorator: ``@no_grad`` without parentheses

    def __init__(self, fn: Callable | None = None) -> None:
        self._previous: list[bool] = []

    def __enter__(self) -> None:
        self._previous.append(set_grad_enabled(self._mode))

    def __exit__(self, *exc: object) -> None:
        set_grad_enabled(self._previous.pop())

    def __call__(self, fn: F) -> F:
        mode = self._mode

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            previous = set_grad_enabled(mode)
            try:
                return fn(*args, **kwargs)
            finally:
                set_grad_enabled(previous)

        return wrapper  # type: ignore[return-value]


class no_grad(_GradMode):
    """Do not record operations: ``with no_grad(): ...``, ``@no_grad()`` or ``@no_grad``."""

    _mode = False


class enable_grad(_GradMode):
    """Record operations again, e.g. inside a ``no_grad`` block (used by recomputation)."""

    _mode = True
