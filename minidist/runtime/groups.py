"""Process groups: a subset of ranks that runs collectives among itself (chapter 23's building block).

A group is identified by its sorted tuple of global ranks, so every member computes the same
identity without talking to anyone (``new_group`` needs no communication, and unlike
torch.distributed it may be called by the members only). Inside a group, rank ``i`` is the
``i``-th smallest global rank; ``src``/``dst`` arguments of collectives are always global ranks.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable


class ProcessGroup:
    """An ordered set of global ranks. ``key`` tags the group's collective messages."""

    __slots__ = ("ranks", "key", "_index")

    def __init__(self, ranks: Iterable[int]) -> None:
        rs = tuple(sorted(int(r) for r in ranks))
        if not rs:
            raise ValueError("new_group: a group needs at least one rank")
        if len(set(rs)) != len(rs):
            raise ValueError(f"new_group: ranks {rs} contain duplicates")
        self.ranks = rs
        self.key = (zlib.crc32(repr(rs).encode()) & 0x3FFFFFFF) + 1
        self._index = {r: i for i, r in enumerate(rs)}

    def size(self) -> int:
        return len(self.ranks)

    def group_rank(self, global_rank: int) -> int:
        """Index of ``global_rank`` inside the group, or -1 if it is not a member."""
        return self._index.get(global_rank, -1)

    def global_rank(self, group_rank: int) -> int:
        if not 0 <= group_rank < len(self.ranks):  # a negative index would wrap round to a real rank
            raise ValueError(f"group rank {group_rank!r} is not part of {self} (group ranks 0..{len(self.ranks) - 1})")
        return self.ranks[group_rank]

    def __contains__(self, global_rank: int) -> bool:
        return global_rank in self._index

    def __len__(self) -> int:
        return len(self.ranks)

    def __eq__(self, other) -> bool:
        return isinstance(other, ProcessGroup) and other.ranks == self.ranks

    def __hash__(self) -> int:
        return hash(self.ranks)

    def __repr__(self) -> str:
        return f"ProcessGroup(ranks={list(self.ranks)})"

    def __getstate__(self):
        return self.ranks

    def __setstate__(self, ranks):
        self.__init__(ranks)
