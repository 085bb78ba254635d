"""The default random generator used by dropout when no ``rng`` is given.

Recomputation (``checkpoint``) saves this generator's state before the forward and restores it
for the re-run, so dropout that uses it replays the same mask. Explicit generators or integer
seeds passed as ``rng=`` are the caller's responsibility (an integer seed always gives the same
mask, which makes it replay-safe by construction).
"""

from __future__ import annotations

from typing import Any

import numpy as np

_generator = np.random.default_rng(0)


def manual_seed(seed: int) -> None:
    """Reseed the default generator."""
    global _generator
    _generator = np.random.default_rng(seed)


def default_generator() -> np.random.Generator:
    return _generator


def get_rng_state() -> dict[str, Any]:
    return _generator.bit_generator.state


def set_rng_state(state: dict[str, Any]) -> None:
    _generator.bit_generator.state = state


def resolve(rng: None | int | np.random.Generator) -> np.random.Generator:
    """None -> the default generator; int -> a fresh generator with that seed; Generator -> itself."""
    if rng is None:
        return _generator
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)):
        return np.random.default_rng(int(rng))
    raise TypeError(f"rng must be None, an int seed or a numpy Generator, got {type(rng).__name__}")
