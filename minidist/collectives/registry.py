"""The table of collective algorithms: ``register`` puts an algorithm file's functions in ``ALGORITHMS``.

The algorithm files import this module, not the package, and the package (``collectives/__init__.py``) imports
them all, so registering never imports the package that is being imported.
"""

from __future__ import annotations

from collections.abc import Callable

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "scatter", "gather", "all_gather", "reduce_scatter",
               "all_to_all", "barrier")

#: collective -> algorithm name -> function
ALGORITHMS: dict[str, dict[str, Callable]] = {name: {} for name in COLLECTIVES}


def register(collective: str, name: str) -> Callable[[Callable], Callable]:
    """Decorator: make ``fn`` available as ``algorithm=name`` for ``collective``."""
    if collective not in ALGORITHMS:
        raise ValueError(f"register: unknown collective {collective!r}; known: {COLLECTIVES}")

    def deco(fn: Callable) -> Callable:
        ALGORITHMS[collective][name] = fn
        return fn

    return deco
