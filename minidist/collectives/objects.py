"""Python objects over the collectives: torch.distributed's ``*_object`` calls, built on the tensor ones.

An object travels as its pickle: a byte array whose length only its owner knows, so each call first
moves the lengths (a small collective of int64), then the bytes padded to the longest (one collective
of uint8), and every receiver unpickles what it got. Both collectives are charged to the simulated clock
like any other. As in torch, unpickling runs whatever the pickle says: use them between your own ranks only.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np

from minidist.collectives.api import all_gather_into_tensor, broadcast, gather, scatter
from minidist.runtime.context import current
from minidist.runtime.groups import ProcessGroup


def _size(group, name: str) -> int | None:
    """The group's size, or None (after torch's warning) if this rank is not in it: the call does nothing."""
    ctx = current(f"md.dist.{name}")
    g = ctx.world if group is None else group
    if not isinstance(g, ProcessGroup):
        raise TypeError(f"{name}: group must be a ProcessGroup (from new_group or a mesh), got {type(g).__name__}")
    if ctx.rank in g:
        return g.size()
    warnings.warn(f"md.dist.{name}: rank {ctx.rank} is not a member of {g}, so the call does nothing on it (as in "
                  f"torch.distributed)", stacklevel=3)
    return None


def pickled(obj: object, name: str, what: str) -> bytes:
    """``obj``'s pickle, or a TypeError naming the call and the object that cannot travel."""
    try:
        return pickle.dumps(obj)
    except Exception as e:  # PicklingError, or whatever the object's __reduce__ raises
        raise TypeError(f"{name}: {what} cannot be pickled, so it cannot travel between ranks "
                        f"({type(e).__name__}: {e})") from e


def _bytes(obj, name: str, what: str) -> np.ndarray:
    # a writable copy: the collectives write in place
    return np.frombuffer(bytearray(pickled(obj, name, what)), np.uint8)


def _load(buf: np.ndarray, n: int):
    return pickle.loads(buf[:n].tobytes())


def _gathered(obj, group, p: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's pickle length (a group of ``p``), and this rank's pickle padded to the longest."""
    mine = _bytes(obj, name, "obj")
    sizes = np.zeros(p, np.int64)
    all_gather_into_tensor(sizes, np.array([mine.size], np.int64), group=group)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: mine.size] = mine
    return sizes, padded


def broadcast_object_list(object_list: list, src: int = 0, group=None) -> None:
    """Rank ``src``'s ``object_list`` replaces the contents of ``object_list`` on every rank (same length)."""
    if _size(group, "broadcast_object_list") is None:
        return
    if not isinstance(object_list, list):
        raise TypeError(f"broadcast_object_list: object_list must be a list (filled in place), got "
                        f"{type(object_list).__name__}")
    me = current().rank
    blob = _bytes(object_list, "broadcast_object_list", "object_list") if me == src else np.zeros(0, np.uint8)
    n = np.array([blob.size, len(object_list)], np.int64)
    broadcast(n, src, group=group)
    if me != src and n[1] != len(object_list):
        raise ValueError(f"broadcast_object_list: rank {me} passed a list of {len(object_list)} but "
                         f"src={src} sends {int(n[1])} objects (the lists must have the same length)")
    buf = blob if me == src else np.zeros(int(n[0]), np.uint8)
    broadcast(buf, src, group=group)
    if me != src:
        object_list[:] = _load(buf, int(n[0]))


def all_gather_object(object_list: list, obj, group=None) -> None:
    """``object_list[i]`` becomes group rank i's ``obj`` on every rank."""
    p = _size(group, "all_gather_object")
    if p is None:
        return
    if not isinstance(object_list, list) or len(object_list) != p:
        got = f"a list of {len(object_list)}" if isinstance(object_list, list) else type(object_list).__name__
        raise ValueError(f"all_gather_object: object_list must be a list of {p} (one per rank of the group), got {got}")
    sizes, padded = _gathered(obj, group, p, "all_gather_object")
    out = np.zeros(p * padded.size, np.uint8)
    all_gather_into_tensor(out, padded, group=group)
    for i, n in enumerate(sizes):
        object_list[i] = _load(out[i * padded.size:], int(n))


def gather_object(obj, object_gather_list: list | None = None, dst: int = 0, group=None) -> None:
    """On rank ``dst``, ``object_gather_list[i]`` becomes group rank i's ``obj``; the others pass None."""
    p = _size(group, "gather_object")
    if p is None:
        return
    root = current().rank == dst
    if root and (not isinstance(object_gather_list, list) or len(object_gather_list) != p):
        raise ValueError(f"gather_object: object_gather_list must be a list of {p} on dst={dst}")
    if not root and object_gather_list is not None:  # torch refuses it too, as gather does
        raise ValueError(f"gather_object: object_gather_list is given on rank {current().rank}, but only the "
                         f"destination (dst={dst}) may pass one, as in torch.distributed (pass None elsewhere)")
    sizes, padded = _gathered(obj, group, p, "gather_object")
    got = [np.zeros(padded.size, np.uint8) for _ in range(p)] if root else None
    gather(padded, got, dst, group=group)
    if root:
        for i, n in enumerate(sizes):
            object_gather_list[i] = _load(got[i], int(n))


def scatter_object_list(scatter_object_output_list: list, scatter_object_input_list: list | None = None,
                        src: int = 0, group=None) -> None:
    """Group rank i receives rank ``src``'s ``scatter_object_input_list[i]`` as ``scatter_object_output_list[0]``."""
    p = _size(group, "scatter_object_list")
    if p is None:
        return
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        raise ValueError("scatter_object_list: scatter_object_output_list must be a list of at least one element "
                         "(its first receives this rank's object)")
    root = current().rank == src
    if root and (not isinstance(scatter_object_input_list, list) or len(scatter_object_input_list) != p):
        raise ValueError(f"scatter_object_list: scatter_object_input_list must be a list of {p} on src={src}")
    blobs = ([_bytes(o, "scatter_object_list", f"scatter_object_input_list[{i}]")
              for i, o in enumerate(scatter_object_input_list)] if root else [])
    longest = np.array([max((b.size for b in blobs), default=0)], np.int64)
    broadcast(longest, src, group=group)
    sizes = [np.array([b.size], np.int64) for b in blobs] if root else None
    mine = np.zeros(1, np.int64)
    scatter(mine, sizes, src, group=group)
    padded = [np.pad(b, (0, int(longest[0]) - b.size)) for b in blobs] if root else None
    buf = np.zeros(int(longest[0]), np.uint8)
    scatter(buf, padded, src, group=group)
    scatter_object_output_list[0] = _load(buf, int(mine[0]))
