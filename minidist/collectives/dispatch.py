"""What every collective call goes through, whatever the collective: its buffers, its signature, its plan and
its run.

``_run`` is the common driver of ``api.py``'s public functions: the membership check, the algorithm choice (by
``choose``, remembered per call), the signature that travels with every message of the call, the clock's comm
stream, the agreement of a rooted call, and the ``Work`` of an asynchronous one. A small collective is dominated
by this bookkeeping, not by its bytes, so what repeats call after call is planned once per distinct call
(``_Plan``) and compared, not recomputed, when the same call comes again.
"""

from __future__ import annotations

import warnings
import zlib
from functools import lru_cache

import numpy as np

from minidist.collectives import ALGORITHMS, choose, finishes_with_root
from minidist.collectives.buffers import as_array
from minidist.collectives.comm import Comm, _Cursor
from minidist.collectives.native import NATIVE
from minidist.runtime import context
from minidist.runtime.context import current
from minidist.runtime.errors import MismatchError
from minidist.runtime.groups import ProcessGroup
from minidist.runtime.ops import ReduceOp
from minidist.runtime.work import Work


def _arr(t, op: str, writable: bool = True) -> np.ndarray:
    if type(t) is np.ndarray and t.dtype.kind in "biufc" and (t.flags.writeable or not writable):
        return t  # the common case, checked without a call
    return as_array(t, op, writable)


def _contiguous(arr: np.ndarray) -> np.ndarray:
    """``arr`` as a flat C-contiguous array (a view when it already is one; np.require costs more)."""
    flat = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
    return flat if flat.ndim == 1 else flat.reshape(-1)


def _flat(arr: np.ndarray):
    """(flat C-contiguous buffer, write-back function or None) for working on ``arr`` in place."""
    if arr.flags.c_contiguous:
        return (arr if arr.ndim == 1 else arr.reshape(-1)), None
    tmp = arr.copy(order="C")

    def back():
        arr[...] = tmp

    return tmp.reshape(-1), back


@lru_cache(maxsize=1024)
def _describe(shape, dtype) -> str:
    return f"shape={tuple(shape)}, dtype={np.dtype(dtype).name}"


# Formatters of signature details (``_run`` formats one only when it meets a call for the first time).
def _with(shape, dtype, what: str, value) -> str:
    return f"{_describe(shape, dtype)}, {what}={value}"


def _with_op(shape, dtype, op: ReduceOp, prefix: str = "") -> str:
    return f"{prefix}{_describe(shape, dtype)}, op={op.name}"


def _rows(shape, dtype) -> str:
    return f"rows of shape {shape}, dtype={np.dtype(dtype).name}"


# Collectives whose result on every rank depends on every rank's data: a rank can only finish one by
# receiving messages that passed through every other rank, each checked against its own signature,
# so finishing proves that all ranks made the same call. Rooted ones (a broadcast's root receives
# nothing) must compare signatures on the board before they return.
_EVERYONE_HEARS_EVERYONE = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"}

_SIGS: dict[tuple, bytes] = {}  # (name, detail, algorithm, ranks) -> signature
_CHOICES: dict[tuple, tuple] = {}  # (collective, nbytes, ranks, id(cluster)) -> (cluster, algorithm)


def _signature(name: str, detail: str, algorithm: str, ranks: tuple) -> bytes:
    key = (name, detail, algorithm, ranks)
    sig = _SIGS.get(key)
    if sig is None:
        if len(_SIGS) > 4096:
            _SIGS.clear()
        args = f"{detail}, algorithm={algorithm!r}" if detail else f"algorithm={algorithm!r}"
        sig = _SIGS[key] = f"{name}({args}) on {_ranks_text(ranks)}".encode()
    return sig


def _ranks_text(ranks: tuple) -> str:
    """A group as people read it: every rank of a small one; the ends and a checksum of a large one."""
    if len(ranks) <= 16:
        return f"ranks {list(ranks)}"
    return (f"{len(ranks)} ranks [{ranks[0]}, {ranks[1]}, {ranks[2]}, ..., {ranks[-1]}] "
            f"(checksum {zlib.crc32(repr(ranks).encode()):08x})")


def _choose(coll: str, nbytes: int, c: Comm) -> str:
    key = (coll, nbytes, c.ranks, id(c.cluster))
    hit = _CHOICES.get(key)
    if hit is None or hit[0] is not c.cluster:
        if len(_CHOICES) > 4096:
            _CHOICES.clear()
        hit = _CHOICES[key] = (c.cluster, choose(coll, nbytes, c))
    return hit[1]


class _Plan:
    """What repeats from one call to the next with the same arguments: checked, chosen and spelled once.

    A small collective costs more in this bookkeeping than in its bytes (its latency is Python's, not the
    memory's), so each rank keeps one plan per distinct call (group, algorithm, shapes, dtype, op, root):
    the membership check, the algorithm choice, the signature text and the group-local Comm.
    """

    __slots__ = ("cluster", "group", "comm", "fn", "sig", "talks", "agree")


def _plan(ctx, key: tuple | None, coll: str, name: str, group, algorithm, nbytes: int, detail) -> _Plan | None:
    """The plan of a call this rank meets for the first time (remembered under ``key``, unless None); None if
    this rank is not in the group."""
    g = ctx.world if group is None else group
    if not isinstance(g, ProcessGroup):
        raise TypeError(f"{name}: group must be a ProcessGroup (from new_group or a mesh), got {type(g).__name__}")
    if ctx.rank not in g:
        return None
    c = Comm(ctx, g.ranks, _Cursor(0.0), -(g.key << 6) - 1, b"", name)
    if algorithm is None:
        algorithm = _choose(coll, nbytes, c)
    fn = ALGORITHMS[coll].get(algorithm) or (NATIVE[coll] if algorithm == "native" else None)
    if fn is None:
        raise ValueError(f"{name}: unknown algorithm {algorithm!r}; available: {sorted(ALGORITHMS[coll])} "
                         f"(and 'native', MPI's own, under the MPI backend)")
    if type(detail) is tuple and detail[0] is _with_op:  # a reduction, checked once per distinct call (not per call)
        _op_ok(detail[3], np.dtype(detail[2]), detail[1], name)
    text = detail if isinstance(detail, str) else detail[0](*detail[1:])
    represents = getattr(ctx.transport, "represents", None)
    if coll in ("broadcast", "scatter") and represents is not None and represents(g.ranks) \
            and not finishes_with_root(coll, algorithm, g.size()):
        raise ValueError(
            f"{name}({text}, algorithm={algorithm!r}) on {_ranks_text(g.ranks)}: with representatives, rank "
            f"{ctx.rank} stands for members that would finish this call at other moments than it does, so their "
            f"clocks cannot be taken from its own; run every rank (representatives=False), or use a group whose "
            f"size is a power of two with algorithm=None (a {coll} by binomial tree)")
    plan = _Plan()
    plan.cluster, plan.group, plan.comm, plan.fn = ctx.cluster, g, c, fn
    plan.sig = c._sig = _signature(name, text, algorithm, g.ranks)
    plan.talks = g.size() > 1
    plan.agree = plan.talks and coll not in _EVERYONE_HEARS_EVERYONE
    if key is not None:
        if len(ctx.plans) > 4096:
            ctx.plans.clear()
        ctx.plans[key] = plan
    return plan


def _run(coll: str, name: str, group, algorithm, nbytes: int, detail, async_op: bool, args: tuple, after=None,
         out: tuple = ()):
    """Common driver: membership, algorithm choice, signature, clock, Work; runs the algorithm on ``args``.

    ``detail`` describes the arguments in the signature: a string, or (formatter, *args) to format only
    the first time this rank makes that call. ``out`` lists the caller's tensors the call writes (the value
    of the Work's future).
    """
    ctx = context._current
    if ctx is None or ctx.destroyed:
        ctx = current("md.dist." + name)  # only to say what is missing
    key = (coll, name, group, algorithm, nbytes, detail)
    last = ctx.last_plan
    if last is not None and last[0] == key:  # the same call again: compared, not hashed (a dtype hashes slowly)
        plan = last[1]
    else:
        try:
            plan = ctx.plans.get(key)
        except TypeError:  # an unhashable group: _plan's checks name it
            plan = key = None
    if plan is None or plan.cluster is not ctx.cluster:
        plan = _plan(ctx, key, coll, name, group, algorithm, nbytes, detail)
        if plan is None:  # torch.distributed's rule: a rank outside the group returns at once
            warnings.warn(f"md.dist.{name}: rank {ctx.rank} is not a member of {group}, so the call does nothing "
                          f"on it (as in torch.distributed)", stacklevel=3)
            return None
    if key is not None:
        ctx.last_plan = (key, plan)
    tp, clock = ctx.transport, ctx.clock
    start = clock.begin_comm()
    c = plan.comm
    cursor = c._cursor  # the plan's own: a call's sub-groups share it, and nothing keeps it past the call
    cursor.t = start
    g, sig = plan.group, plan.sig
    try:
        if plan.talks:
            seq = ctx.next_seq(g)
            tp.publish(g.ranks, g.key, seq, sig, wake=plan.agree)  # only peers in agree() sleep on it
            plan.fn(c, *args)
            if plan.agree:
                tp.agree(g.ranks, g.key, seq, sig, name)
        else:
            plan.fn(c, *args)
    except MismatchError as e:  # the call is broken on every rank: make sure they all hear why
        tp.board.abort(str(e), mismatch=True)
        tp.ring_all()
        raise
    finally:
        tp.coll = None
    if after is not None:
        after()
    clock.end_comm(name, start, cursor.t, nbytes, async_op)
    if async_op:
        return Work(ctx, (), start, cursor.t, name, nbytes, record=False, result=out)
    return None


_AVG = ReduceOp.AVG


_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


def _op_ok(op: ReduceOp, dtype: np.dtype, shape: tuple, name: str) -> None:
    """Refuse an op the dtype gives no meaning to (torch refuses the same)."""
    if op is ReduceOp.AVG and dtype.kind not in "fc":
        raise TypeError(f"{name}: ReduceOp.AVG needs a floating dtype, got {dtype} (shape {shape})")
    if op in _BITWISE and dtype.kind not in "biu":
        raise TypeError(f"{name}: {op!r} combines bits: it needs an integer or bool dtype, got {dtype} (shape {shape})")
    if op in (ReduceOp.MIN, ReduceOp.MAX) and dtype.kind == "c":
        raise TypeError(f"{name}: {op!r} is not defined on complex numbers (they have no order), got {dtype}")


def _base(op: ReduceOp) -> ReduceOp:
    return ReduceOp.SUM if op is ReduceOp.AVG else op


def _root(root, group, name: str, role: str) -> int:
    ctx = current(f"md.dist.{name}")
    group = ctx.world if group is None else group
    if not isinstance(root, (int, np.integer)) or root not in group:
        raise ValueError(f"{name}: {role}={root!r} is not a rank of {group if group is not None else 'the world'}")
    return group.group_rank(int(root))
