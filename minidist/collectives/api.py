"""The public collectives, torch.distributed style: check, choose an algorithm, run it, charge the clock.

Each call (1) validates its own arguments and names the op and shapes when they are wrong, (2)
publishes a signature (op, group, shapes, dtype, root, reduce op, algorithm) that travels with
every message of the call, so ranks that disagree stop with a message naming both calls instead
of exchanging garbage, (3) runs the algorithm on the comm stream starting at
``max(compute, comm)``, and (4) joins the streams (sync) or returns a ``Work`` (``async_op=True``).

A small collective is dominated by this bookkeeping, not by its bytes, so the pieces that repeat
call after call (the signature text, the algorithm choice) are computed once and remembered: steps (2) to (4)
are ``dispatch.py``'s, shared by every collective.
"""

from __future__ import annotations

import math

import numpy as np

from minidist.collectives.comm import pieces
from minidist.collectives.dispatch import (
    _AVG,
    _arr,
    _base,
    _contiguous,
    _describe,
    _flat,
    _op_ok,
    _root,
    _rows,
    _run,
    _with,
    _with_op,
)
from minidist.runtime.context import current
from minidist.runtime.ops import ReduceOp, as_op


# -- the collectives -----------------------------------------------------------------------
def broadcast(tensor, src: int, group=None, async_op: bool = False, algorithm: str | None = None):
    """Copy ``tensor`` of global rank ``src`` into ``tensor`` on every rank of ``group``."""
    arr = _arr(tensor, "broadcast")
    root = _root(src, group, "broadcast", "src")
    flat, back = _flat(arr)
    return _run("broadcast", "broadcast", group, algorithm, arr.nbytes,
                (_with, arr.shape, arr.dtype, "src", src), async_op,
                (flat, root), back, (tensor,))


def reduce(tensor, dst: int, op=ReduceOp.SUM, group=None, async_op: bool = False, algorithm: str | None = None):
    """Combine ``tensor`` over ranks with ``op``; the result lands in ``tensor`` on global rank ``dst``."""
    arr = _arr(tensor, "reduce")
    op = as_op(op, "reduce")
    _op_ok(op, arr.dtype, arr.shape, "reduce")
    root = _root(dst, group, "reduce", "dst")
    ctx = current("md.dist.reduce")
    g = ctx.world if group is None else group
    is_root = g.group_rank(ctx.rank) == root
    if is_root:
        flat, back = _flat(arr)
    else:
        flat, back = arr.reshape(-1).copy(), None  # others' buffers stay untouched

    def after():
        if is_root and op is ReduceOp.AVG:
            flat[...] /= g.size()
        if back is not None:
            back()

    return _run("reduce", "reduce", group, algorithm, arr.nbytes,
                f"{_describe(arr.shape, arr.dtype)}, dst={dst}, op={op.name}", async_op,
                (flat, root, _base(op)), after, (tensor,))


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False, algorithm: str | None = None):
    """Combine ``tensor`` over the ranks of ``group`` with ``op``; every rank gets the result in place."""
    flags = tensor.flags if type(tensor) is np.ndarray else None
    ok = flags is not None and flags.writeable and tensor.dtype.kind in "biufc"
    arr = tensor if ok else _arr(tensor, "all_reduce")
    op = op if type(op) is ReduceOp else as_op(op, "all_reduce")
    detail = (_with_op, arr.shape, arr.dtype, op)
    if op is not _AVG and (flags if ok else arr.flags).c_contiguous:  # the common case, nothing to do afterwards
        flat = arr if arr.ndim == 1 else arr.reshape(-1)
        return _run("all_reduce", "all_reduce", group, algorithm, arr.nbytes, detail, async_op,
                    (flat, op), None, (tensor,))
    _op_ok(op, arr.dtype, arr.shape, "all_reduce")
    flat, back = _flat(arr)
    ctx = current("md.dist.all_reduce")
    size = (ctx.world if group is None else group).size()

    def after():
        if op is ReduceOp.AVG:
            flat[...] /= size
        if back is not None:
            back()

    return _run("all_reduce", "all_reduce", group, algorithm, arr.nbytes, detail, async_op,
                (flat, _base(op)), after, (tensor,))


def _list_of(arrs, like: np.ndarray, name: str, what: str, size: int) -> list:
    if arrs is None or len(arrs) != size:
        n = "None" if arrs is None else len(arrs)
        raise ValueError(f"{name}: {what} must be a list of {size} tensors (one per rank of the group), got {n}")
    out = [_arr(a, name) for a in arrs]
    for i, a in enumerate(out):
        if a.shape != like.shape or a.dtype != like.dtype:
            raise ValueError(f"{name}: {what}[{i}] has {_describe(a.shape, a.dtype)} but the tensor has "
                             f"{_describe(like.shape, like.dtype)}")
    return out


def scatter(tensor, scatter_list=None, src: int = 0, group=None, async_op: bool = False,
            algorithm: str | None = None):
    """Global rank ``src`` sends ``scatter_list[i]`` to group rank i, which receives it in ``tensor``."""
    arr = _arr(tensor, "scatter")
    root = _root(src, group, "scatter", "src")
    ctx = current("md.dist.scatter")
    g = ctx.world if group is None else group
    flat, back = _flat(arr)
    chunks = None
    if g.group_rank(ctx.rank) == root:
        chunks = [np.require(a, requirements="C").reshape(-1) for a in _list_of(scatter_list, arr, "scatter",
                                                                       "scatter_list", g.size())]
    elif scatter_list and ctx.rank in g:  # torch refuses it too: code that passes one everywhere fails there
        raise ValueError(f"scatter: scatter_list is given on rank {ctx.rank}, but only the source (src={src}) may "
                         f"pass one, as in torch.distributed (pass None elsewhere)")
    return _run("scatter", "scatter", group, algorithm, arr.nbytes,
                f"{_describe(arr.shape, arr.dtype)}, src={src}", async_op,
                (flat, chunks, root), back, (tensor,))


def gather(tensor, gather_list=None, dst: int = 0, group=None, async_op: bool = False,
           algorithm: str | None = None):
    """Global rank ``dst`` receives every rank's ``tensor`` in ``gather_list`` (rank order)."""
    arr = _arr(tensor, "gather", writable=False)
    root = _root(dst, group, "gather", "dst")
    ctx = current("md.dist.gather")
    g = ctx.world if group is None else group
    inp = np.require(arr, requirements="C").reshape(-1)
    chunks, backs = None, []
    if g.group_rank(ctx.rank) == root:
        chunks = []
        for a in _list_of(gather_list, arr, "gather", "gather_list", g.size()):
            f, b = _flat(a)
            chunks.append(f)
            if b is not None:
                backs.append(b)
    elif gather_list and ctx.rank in g:
        raise ValueError(f"gather: gather_list is given on rank {ctx.rank}, but only the destination (dst={dst}) "
                         f"may pass one, as in torch.distributed (pass None elsewhere)")
    return _run("gather", "gather", group, algorithm, arr.nbytes,
                f"{_describe(arr.shape, arr.dtype)}, dst={dst}", async_op,
                (inp, chunks, root), lambda: [b() for b in backs], () if gather_list is None else tuple(gather_list))


def all_gather(tensor_list, tensor, group=None, async_op: bool = False, algorithm: str | None = None):
    """Every rank receives every rank's ``tensor`` in ``tensor_list`` (rank order).

    As in torch.distributed the ranks' tensors may differ in size (``tensor_list[i]`` sized as rank i's); such
    an all-gather runs as an all-to-all in which each rank sends its one tensor to everyone."""
    arr = _arr(tensor, "all_gather", writable=False)
    ctx = current("md.dist.all_gather")
    g = ctx.world if group is None else group
    if (tensor_list is not None and len(tensor_list) == g.size() and ctx.rank in g
            and any(_arr(a, "all_gather").shape != arr.shape for a in tensor_list)):
        own = _arr(tensor_list[g.group_rank(ctx.rank)], "all_gather")
        if own.shape != arr.shape:
            raise ValueError(f"all_gather: tensor_list[{g.group_rank(ctx.rank)}] (this rank's own place) has "
                             f"{_describe(own.shape, own.dtype)} but the tensor has {_describe(arr.shape, arr.dtype)}")
        return _all_to_all_lists("all_gather", tensor_list, [arr] * g.size(), group, async_op, algorithm)
    outs, backs = [], []
    for a in _list_of(tensor_list, arr, "all_gather", "tensor_list", g.size()):
        f, b = _flat(a)
        outs.append(f)
        if b is not None:
            backs.append(b)
    inp = _contiguous(arr)
    return _run("all_gather", "all_gather", group, algorithm, arr.nbytes, (_describe, arr.shape, arr.dtype), async_op,
                (outs, inp), lambda: [b() for b in backs], tuple(tensor_list))


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False,
                           algorithm: str | None = None):
    """Concatenate every rank's ``input_tensor`` along dim 0 into ``output_tensor`` (rank order)."""
    inp = _arr(input_tensor, "all_gather_into_tensor", writable=False)
    out = _arr(output_tensor, "all_gather_into_tensor")
    ctx = current("md.dist.all_gather_into_tensor")
    p = (ctx.world if group is None else group).size()
    ok_shape = inp.ndim > 0 and out.shape == (p * inp.shape[0],) + inp.shape[1:]
    if out.dtype != inp.dtype or not (ok_shape or out.shape == (p,) + inp.shape):
        want = (p * inp.shape[0],) + inp.shape[1:] if inp.ndim else (p,)
        raise ValueError(f"all_gather_into_tensor: output has {_describe(out.shape, out.dtype)} but {p} ranks "
                         f"with input {_describe(inp.shape, inp.dtype)} need shape {want}")
    flat, back = _flat(out)
    outs = pieces(flat, (flat.size // p,) * p)
    src = _contiguous(inp)
    return _run("all_gather", "all_gather_into_tensor", group, algorithm, inp.nbytes,
                (_describe, inp.shape, inp.dtype), async_op, (outs, src), back, (output_tensor,))


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op: bool = False,
                          algorithm: str | None = None):
    """Reduce ``input`` over ranks and give rank i the i-th dim-0 block of the result in ``output``."""
    inp = _arr(input, "reduce_scatter_tensor", writable=False)
    out = _arr(output, "reduce_scatter_tensor")
    op = as_op(op, "reduce_scatter_tensor")
    _op_ok(op, out.dtype, out.shape, "reduce_scatter_tensor")
    ctx = current("md.dist.reduce_scatter_tensor")
    p = (ctx.world if group is None else group).size()
    ok = inp.dtype == out.dtype and inp.size == p * out.size and (
        (out.ndim > 0 and inp.shape == (p * out.shape[0],) + out.shape[1:]) or inp.shape == (p,) + out.shape)
    if not ok:
        raise ValueError(f"reduce_scatter_tensor: input has {_describe(inp.shape, inp.dtype)} but output has "
                         f"{_describe(out.shape, out.dtype)}; with {p} ranks the input must be {p} output blocks "
                         f"along dim 0")
    return _reduce_scatter("reduce_scatter_tensor", out, inp.reshape(-1).copy(), op, p, group, algorithm, async_op,
                           output)


def _reduce_scatter(name: str, out: np.ndarray, scratch: np.ndarray, op: ReduceOp, p: int, group, algorithm,
                    async_op: bool, output):
    """Both forms: ``scratch`` holds the p input blocks end to end (a copy: the algorithms reduce into it)."""
    flat, back = _flat(out)

    def after():
        if op is ReduceOp.AVG:
            flat[...] /= p
        if back is not None:
            back()

    return _run("reduce_scatter", name, group, algorithm, out.nbytes, (_with_op, out.shape, out.dtype, op, "output "),
                async_op, (flat, pieces(scratch, (out.size,) * p), _base(op)), after, (output,))


def _splits(splits, rows: int, p: int, name: str, what: str) -> tuple[int, ...]:
    if splits is None or (isinstance(splits, (list, tuple)) and not splits):  # torch: None or empty, equal rows
        if rows % p:
            raise ValueError(f"all_to_all_single: {what} has {rows} rows along dim 0, not divisible by {p} ranks; "
                             f"pass {name}")
        return (rows // p,) * p  # a tuple: pieces() remembers the offsets of a tuple of sizes
    splits = tuple(int(s) for s in splits)
    if len(splits) != p or any(s < 0 for s in splits) or sum(splits) != rows:
        raise ValueError(f"all_to_all_single: {name}={list(splits)} must be {p} non-negative sizes summing to the "
                         f"{rows} rows of {what}")
    return splits


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op: bool = False, algorithm: str | None = None):
    """Rank j's ``input`` rows for rank i (``input_split_sizes[i]`` of them) land in rank i's ``output``."""
    inp = _arr(input, "all_to_all_single", writable=False)
    out = _arr(output, "all_to_all_single")
    ctx = current("md.dist.all_to_all_single")
    g = ctx.world if group is None else group
    p = g.size()
    if inp.ndim == 0 or out.ndim == 0 or inp.shape[1:] != out.shape[1:] or inp.dtype != out.dtype:
        raise ValueError(f"all_to_all_single: input {_describe(inp.shape, inp.dtype)} and output "
                         f"{_describe(out.shape, out.dtype)} must share dtype and every dim but the first")
    ins_sz = _splits(input_split_sizes, inp.shape[0], p, "input_split_sizes", "input")
    outs_sz = _splits(output_split_sizes, out.shape[0], p, "output_split_sizes", "output")
    me = g.group_rank(ctx.rank)
    if me >= 0 and ins_sz[me] != outs_sz[me]:  # its own block is both sent and received: no peer can check it
        raise ValueError(f"all_to_all_single: rank {ctx.rank} keeps input_split_sizes[{me}]={ins_sz[me]} rows for "
                         f"itself but output_split_sizes[{me}]={outs_sz[me]} (its own block is both)")
    row = math.prod(inp.shape[1:])
    src = _contiguous(inp)
    flat, back = _flat(out)
    ins = pieces(src, ins_sz if row == 1 else tuple(s * row for s in ins_sz))
    outs = pieces(flat, outs_sz if row == 1 else tuple(s * row for s in outs_sz))
    return _run("all_to_all", "all_to_all_single", group, algorithm, row * inp.itemsize,
                (_rows, inp.shape[1:], inp.dtype), async_op,
                (outs, ins), back, (output,))


def _tensors(arrs, size: int, name: str, what: str, writable: bool) -> list[np.ndarray]:
    if arrs is None or len(arrs) != size:
        n = "None" if arrs is None else len(arrs)
        raise ValueError(f"{name}: {what} must be a list of {size} tensors (one per rank of the group), got {n}")
    return [_arr(a, name, writable) for a in arrs]


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op: bool = False,
               algorithm: str | None = None):
    """Every rank's ``input_tensor_list[i]`` lands in rank i's ``output_tensor_list`` at the sender's index.

    torch.distributed's list form: the tensors may differ in size (rank i's ``output_tensor_list[j]`` holds
    as many elements as rank j's ``input_tensor_list[i]``), not in dtype. It runs as ``all_to_all_single`` on
    the lists laid end to end."""
    return _all_to_all_lists("all_to_all", output_tensor_list, input_tensor_list, group, async_op, algorithm)


def _all_to_all_lists(name: str, output_tensor_list, input_tensor_list, group, async_op: bool, algorithm):
    ctx = current(f"md.dist.{name}")
    p = (ctx.world if group is None else group).size()
    what_in, what_out = ("input_tensor_list", "output_tensor_list") if name == "all_to_all" else ("tensor",
                                                                                                  "tensor_list")
    ins = _tensors(input_tensor_list, p, name, what_in, False)
    outs = _tensors(output_tensor_list, p, name, what_out, True)
    dtype = ins[0].dtype
    odd = [f"{what}[{i}] is {a.dtype}" for what, arrs in ((what_in, ins), (what_out, outs))
           for i, a in enumerate(arrs) if a.dtype != dtype]
    if odd:
        raise ValueError(f"{name}: every tensor must have the dtype of {what_in}"
                         f"{'[0]' if name == 'all_to_all' else ''}, {dtype}; {', '.join(odd)}")
    me = (ctx.world if group is None else group).group_rank(ctx.rank)
    if me >= 0 and ins[me].size != outs[me].size:
        raise ValueError(f"{name}: rank {ctx.rank} keeps {what_in}[{me}] ({ins[me].size} elements) for "
                         f"itself in {what_out}[{me}] ({outs[me].size} elements): they must be as large")
    src = np.concatenate([a.reshape(-1) for a in ins])
    flat = np.empty(sum(a.size for a in outs), dtype)
    out_pieces = pieces(flat, [a.size for a in outs])

    def after():
        for a, piece in zip(outs, out_pieces):
            a[...] = piece.reshape(a.shape)

    return _run("all_to_all", name, group, algorithm, dtype.itemsize, (_rows, (), dtype), async_op,
                (out_pieces, pieces(src, [a.size for a in ins])), after, tuple(output_tensor_list))


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op: bool = False,
                   algorithm: str | None = None):
    """Reduce ``input_list`` over ranks; rank i receives the reduced ``input_list[i]`` in ``output`` (torch's
    list form of ``reduce_scatter_tensor``: every entry has ``output``'s shape and dtype)."""
    out = _arr(output, "reduce_scatter")
    op = as_op(op, "reduce_scatter")
    _op_ok(op, out.dtype, out.shape, "reduce_scatter")
    ctx = current("md.dist.reduce_scatter")
    p = (ctx.world if group is None else group).size()
    scratch = np.concatenate([a.reshape(-1) for a in _list_of(input_list, out, "reduce_scatter", "input_list", p)])
    return _reduce_scatter("reduce_scatter", out, scratch, op, p, group, algorithm, async_op, output)


def barrier(group=None, async_op: bool = False, algorithm: str | None = None):
    """Return once every rank of ``group`` has called barrier."""
    return _run("barrier", "barrier", group, algorithm, 0, "", async_op, ())
