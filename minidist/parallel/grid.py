"""The one place that owns rank arithmetic: which global rank plays which role on the device mesh.

Picotron's lesson: every strategy asks a single grid "which group do I reduce gradients over?",
"which rank holds my shard?", instead of computing rank numbers itself. The mesh dimensions are
ordered ``(pp, dp, ep, cp, tp)`` with ``tp`` varying fastest, so tensor-parallel peers are
neighbours (inside one node, where the links are fast) and pipeline stages are furthest apart,
like Megatron-LM. Axes of size one are kept, so later strategies plug in without renumbering.
"""

from __future__ import annotations

import numpy as np

from minidist.parallel.config import ParallelConfig

AXES = ("pp", "dp", "ep", "cp", "tp")


class ParallelGrid:
    """Coordinates of ``rank`` in the ``(pp, dp, ep, cp, tp)`` grid and the groups along each axis.

    Pure arithmetic (no communication): build it inside ``md.launch`` to get process groups with
    :meth:`group`, or outside to reason about a layout with :meth:`coords` and :meth:`ranks_along`.
    """

    def __init__(self, config: ParallelConfig, rank: int = 0) -> None:
        self.config = config
        self.shape = tuple(getattr(config, a) for a in AXES)
        self.world_size = int(np.prod(self.shape))
        if not 0 <= rank < self.world_size:
            raise ValueError(f"ParallelGrid: rank {rank} is outside the world of {self.world_size} ranks "
                             f"(grid {dict(zip(AXES, self.shape))})")
        self.rank = rank
        self._ranks = np.arange(self.world_size).reshape(self.shape)
        self._groups: dict[str, object] = {}

    def coords(self, rank: int | None = None) -> dict[str, int]:
        """``{"pp": i, "dp": j, ...}`` of ``rank`` (this rank by default)."""
        r = self.rank if rank is None else rank
        return dict(zip(AXES, (int(c) for c in np.unravel_index(r, self.shape))))

    def ranks_along(self, axis: str, rank: int | None = None) -> list[int]:
        """Global ranks that differ from ``rank`` only in ``axis``, in axis order."""
        if axis not in AXES:
            raise ValueError(f"ParallelGrid: unknown axis {axis!r}; axes are {AXES}")
        c = self.coords(rank)
        index = tuple(slice(None) if a == axis else c[a] for a in AXES)
        return [int(r) for r in self._ranks[index]]

    def index(self, axis: str) -> int:
        """This rank's position along ``axis`` (its dp rank, tp rank, ...)."""
        return self.coords()[axis]

    def size(self, axis: str) -> int:
        return self.shape[AXES.index(axis)]

    def group(self, axis: str):
        """The process group of this rank along ``axis`` (call inside ``md.launch``)."""
        if axis not in self._groups:
            from minidist import dist

            self._groups[axis] = dist.new_group(self.ranks_along(axis))
        return self._groups[axis]

    def __repr__(self) -> str:
        dims = ", ".join(f"{a}={s}" for a, s in zip(AXES, self.shape))
        return f"ParallelGrid({dims}; rank {self.rank} at {self.coords()})"
