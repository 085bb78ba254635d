"""Flat parameters: many tensors viewed as one padded buffer that splits evenly over ``p`` ranks.

ZeRO and FSDP shard *model state*, not individual tensors: the parameters of one unit (a bucket, a
transformer block) are laid end to end in one flat buffer, padded with zeros to a multiple of
``p`` elements, and rank ``i`` owns elements ``[i n/p, (i+1) n/p)``. Padding is deterministic and
explicit (``padding`` elements), so the memory and communication formulas are exact whenever the
unit size divides by ``p``. Zero padding stays zero through AdamW and SGD (zero gradient, zero
state, zero update), so it never leaks into the weights.
"""

from __future__ import annotations

import numpy as np


class FlatUnit:
    """``params`` (a list of ``(name, Parameter)``) as one flat buffer split into ``world`` shards."""

    def __init__(self, name: str, params: list, world: int, index: int) -> None:
        if not params:
            raise ValueError(f"FlatUnit {name!r}: a unit needs at least one parameter")
        if not 0 <= index < world:
            raise ValueError(f"FlatUnit {name!r}: shard index {index} outside 0..{world - 1}")
        self.name = name
        self.names = [n for n, _ in params]
        self.params = [p for _, p in params]
        self.shapes = [p.data.shape for p in self.params]
        self.sizes = [int(p.data.size) for p in self.params]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(int).tolist()
        self.dtype = self.params[0].data.dtype
        self.numel = self.offsets[-1]
        self.world, self.index = world, index
        self.shard_size = -(-self.numel // world)
        self.padded = self.shard_size * world
        self.padding = self.padded - self.numel
        self.kind = np.empty(0, self.dtype, like=self.params[0].data)  # new buffers are of this kind (shape-only?)

    # -- layout ----------------------------------------------------------------------------
    @property
    def lo(self) -> int:
        return self.index * self.shard_size

    @property
    def hi(self) -> int:
        return self.lo + self.shard_size

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def empty(self) -> np.ndarray:
        """A zeroed padded flat buffer of this unit's dtype (shape-only when the parameters are)."""
        return np.zeros(self.padded, dtype=self.dtype, like=self.kind)

    def flatten(self, arrays, out: np.ndarray | None = None) -> np.ndarray:
        """Copy ``arrays`` (one per parameter, in order) into a padded flat buffer."""
        out = self.empty() if out is None else out
        for a, lo, hi in zip(arrays, self.offsets, self.offsets[1:]):
            out[lo:hi] = np.asarray(a).reshape(-1)
        out[self.numel:] = 0
        return out

    def views(self, flat: np.ndarray) -> list[np.ndarray]:
        """Views of ``flat`` shaped like each parameter (no copy)."""
        return [flat[lo:hi].reshape(shape) for lo, hi, shape in zip(self.offsets, self.offsets[1:], self.shapes)]

    def shard(self, flat: np.ndarray) -> np.ndarray:
        """This rank's slice of a padded flat buffer (a view)."""
        return flat[self.lo:self.hi]

    def segments(self, lo: int | None = None, hi: int | None = None) -> list[tuple[str, int, int, int]]:
        """Which parameters the flat range ``[lo, hi)`` (default: this rank's shard) holds: ``(name, start,
        stop, at)`` says elements ``start:stop`` of parameter ``name`` (flattened) sit at ``at`` in the range."""
        lo, hi = (self.lo, self.hi) if lo is None else (lo, hi)
        out = []
        for name, a, b in zip(self.names, self.offsets, self.offsets[1:]):
            s, e = max(lo, a), min(hi, b)
            if s < e:
                out.append((name, s - a, e - a, s - lo))
        return out

    def split(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Copies of each parameter's values from a padded flat buffer, by name."""
        return {n: v.copy() for n, v in zip(self.names, self.views(flat))}

    def __repr__(self) -> str:
        return (f"FlatUnit({self.name!r}: {len(self.params)} tensors, {self.numel} elements + {self.padding} padding, "
                f"shard {self.shard_size} x {self.world})")


def assemble(units_meta: list[dict], shards_by_rank: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Rebuild full tensors by name from every rank's shards (``{unit name: shard array}``).

    ``units_meta`` lists ``{"name", "names", "shapes", "offsets"}`` per unit, as :func:`describe` gives.
    """
    out = {}
    for u in units_meta:
        flat = np.concatenate([shards[u["name"]] for shards in shards_by_rank])
        for n, lo, hi, shape in zip(u["names"], u["offsets"], u["offsets"][1:], u["shapes"]):
            out[n] = flat[lo:hi].reshape(shape).copy()
    return out


def describe(unit: FlatUnit) -> dict:
    """The picklable layout of a unit, enough for :func:`assemble`."""
    return {"name": unit.name, "names": list(unit.names), "shapes": list(unit.shapes), "offsets": list(unit.offsets)}
