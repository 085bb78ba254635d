"""DeviceMesh: ranks laid out on a named n-dimensional grid (chapters 23-25).

``init_device_mesh((2, 2, 2), ("dp", "pp", "tp"))`` arranges global ranks ``0..7`` in row-major
order, so the last dimension varies fastest: ranks that differ only in their "tp" coordinate are
neighbours, which is where tensor parallelism wants them (inside a node). Each 1-D slice through
this rank is a process group; ``mesh["tp"]`` is the sub-mesh along "tp" containing this rank, and
``mesh["dp", "tp"]`` a 2-D sub-mesh. ``mesh.get_group(("dp", "cp"))`` flattens several dimensions
into one group: the ranks that share every other coordinate with this one (the ranks a gradient is
summed over when both dp and cp split the tokens). The mesh is the single place that owns the rank
arithmetic.

The bijection behind it: along any dimension of size n, the world splits into world/n disjoint
groups of n ranks, one for each setting of the other coordinates, and every rank is in exactly one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from minidist.runtime.context import current
from minidist.runtime.groups import ProcessGroup


class DeviceMesh:
    """A grid of global ranks with named dimensions, seen from one rank."""

    def __init__(self, mesh: np.ndarray, names: Sequence[str], rank: int) -> None:
        self.mesh = np.asarray(mesh, dtype=np.int64)
        self.mesh_dim_names = tuple(names)
        if len(self.mesh_dim_names) != self.mesh.ndim or len(set(self.mesh_dim_names)) != self.mesh.ndim:
            raise ValueError(f"DeviceMesh: need {self.mesh.ndim} distinct dimension names, got {names}")
        where = np.argwhere(self.mesh == rank)
        if len(where) != 1:
            raise ValueError(f"DeviceMesh: rank {rank} is not (exactly once) in the mesh {self.mesh.tolist()}")
        self.rank = rank
        self._coord = tuple(int(i) for i in where[0])
        self._groups: dict[tuple[str, ...], ProcessGroup] = {}

    # -- shape -----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.mesh.shape

    @property
    def ndim(self) -> int:
        return self.mesh.ndim

    def size(self, name: str | tuple[str, ...] | None = None) -> int:
        """Ranks in the mesh, along dimension ``name``, or in the flattened dimensions of a tuple."""
        if name is None:
            return int(self.mesh.size)
        return int(np.prod([self.mesh.shape[d] for d in self._dims(name)]))

    def _dim(self, name: str | int) -> int:
        if isinstance(name, (int, np.integer)):
            if not 0 <= name < self.ndim:
                raise IndexError(f"DeviceMesh: dim {name} out of range for a {self.ndim}-D mesh")
            return int(name)
        try:
            return self.mesh_dim_names.index(name)
        except ValueError:
            raise KeyError(f"DeviceMesh: no dimension {name!r}; dimensions are {self.mesh_dim_names}") from None

    def _dims(self, name) -> tuple[int, ...]:
        """Dimension indices of one name or a tuple of names, in mesh order."""
        names = tuple(name) if isinstance(name, (tuple, list)) else (name,)
        if not names:
            raise ValueError("DeviceMesh: name at least one dimension")
        dims = sorted({self._dim(n) for n in names})
        if len(dims) != len(names):
            raise ValueError(f"DeviceMesh: dimensions {names} name one dimension twice")
        return tuple(dims)

    # -- this rank's place --------------------------------------------------------------------
    def get_coordinate(self) -> tuple[int, ...]:
        """This rank's index along every dimension."""
        return self._coord

    def get_local_rank(self, name: str | int | tuple[str, ...] | None = None) -> int:
        """This rank's index along dimension ``name`` (the only one for a 1-D mesh); for a tuple of
        dimensions, its index in their flattened group (row-major over them, in mesh order)."""
        if name is None:
            if self.ndim != 1:
                raise ValueError(f"DeviceMesh.get_local_rank: name a dimension of {self.mesh_dim_names}")
            name = 0
        index = 0
        for d in self._dims(name):
            index = index * self.mesh.shape[d] + self._coord[d]
        return index

    def get_group(self, name: str | int | tuple[str, ...] | None = None) -> ProcessGroup:
        """The process group of the ranks sharing all coordinates but ``name`` (one dimension or a tuple
        of them, flattened) with this rank."""
        if name is None:
            if self.ndim != 1:
                raise ValueError(f"DeviceMesh.get_group: name a dimension of {self.mesh_dim_names}")
            name = 0
        dims = self._dims(name)
        key = tuple(self.mesh_dim_names[d] for d in dims)
        if key not in self._groups:
            index = tuple(slice(None) if d in dims else self._coord[d] for d in range(self.ndim))
            self._groups[key] = ProcessGroup(self.mesh[index].reshape(-1).tolist())
        return self._groups[key]

    def get_all_groups(self) -> list[ProcessGroup]:
        return [self.get_group(n) for n in self.mesh_dim_names]

    def get_group_ranks(self, name: str | int) -> list[int]:
        return list(self.get_group(name).ranks)

    def __getitem__(self, names) -> DeviceMesh:
        """The sub-mesh over ``names`` (one name or a tuple) that contains this rank."""
        names = (names,) if isinstance(names, str) else tuple(names)
        dims = [self._dim(n) for n in names]
        index = tuple(slice(None) if d in dims else self._coord[d] for d in range(self.ndim))
        sub = self.mesh[index]  # remaining axes keep the mesh's order
        kept = [d for d in range(self.ndim) if d in dims]
        sub = np.transpose(sub, [kept.index(d) for d in dims])
        return DeviceMesh(sub, [self.mesh_dim_names[d] for d in dims], self.rank)

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}={s}" for n, s in zip(self.mesh_dim_names, self.shape))
        return f"DeviceMesh({dims}; rank {self.rank} at {self._coord})"


def init_device_mesh(*args, mesh_shape=None, mesh_dim_names=None) -> DeviceMesh:
    """A mesh over all ranks: ``init_device_mesh((2, 4), ("dp", "tp"))``.

    The torch form ``init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))`` is accepted too.
    """
    args = list(args)
    if args and isinstance(args[0], str):
        args.pop(0)  # device type: every simulated device is the same kind
    if args:
        mesh_shape = args.pop(0)
    if args:
        mesh_dim_names = args.pop(0)
    if mesh_shape is None:
        raise TypeError("init_device_mesh: give the mesh shape, e.g. init_device_mesh((2, 2), ('dp', 'tp'))")
    ctx = current("md.init_device_mesh")
    shape = tuple(int(s) for s in mesh_shape)
    if int(np.prod(shape)) != ctx.world_size:
        raise ValueError(f"init_device_mesh: shape {shape} holds {int(np.prod(shape))} ranks but the world has "
                         f"{ctx.world_size}")
    names = tuple(mesh_dim_names) if mesh_dim_names is not None else tuple(f"dim{i}" for i in range(len(shape)))
    return DeviceMesh(np.arange(ctx.world_size).reshape(shape), names, ctx.rank)
