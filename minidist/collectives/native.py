"""MPI's own collectives behind minidist's API: the cross-check of the learner's algorithms.

Under the MPI backend every collective also takes ``algorithm="native"`` (the table ``NATIVE``, kept
apart from ``ALGORITHMS``): the data moves by the MPI library's implementation (MPICH picks its own
algorithm by size and group) on a communicator of the group's ranks, started non-blocking so that the
wait times out like any other. The answer must agree with minidist's algorithms up to rounding: MPI
may combine the ranks' buffers in another order, and float addition is not associative (chapter 11),
so equality is to a tolerance, not bitwise.

MPI does not say which algorithm it ran, so the simulated clock is charged the closed form of the
algorithm ``choose`` would pick (the ring where the closed forms have no model for it, as for the
hierarchical all-reduce) on the slowest link the group uses: what minidist's own run would charge.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import choose
from minidist.runtime.ops import ReduceOp

_OPS: dict = {}

#: collective -> MPI's own implementation (kept apart from ALGORITHMS: the simulator cannot run them)
NATIVE: dict = {}


def _native(collective: str):
    def deco(fn):
        NATIVE[collective] = fn
        return fn

    return deco


def _mpi():
    from mpi4py import MPI  # optional: only a rank under the MPI backend gets here

    if not _OPS:
        _OPS.update({ReduceOp.SUM: MPI.SUM, ReduceOp.PRODUCT: MPI.PROD, ReduceOp.MIN: MPI.MIN,
                     ReduceOp.MAX: MPI.MAX, ReduceOp.BAND: MPI.BAND, ReduceOp.BOR: MPI.BOR,
                     ReduceOp.BXOR: MPI.BXOR})
    return MPI


def _comm(c):
    group_comm = getattr(c._tp, "group_comm", None)
    if group_comm is None:
        raise ValueError(f"{c.name}: algorithm='native' runs MPI's own collective, so it needs the MPI backend "
                         f"(md.launch(..., backend='mpi') or md.dist.init(backend='mpi'))")
    _mpi()
    return group_comm(c.ranks)


def _charge(c, coll: str, nbytes: int, total: int) -> None:
    """Move the cursor by the closed form of the algorithm minidist would have run."""
    # imported here: the estimator is a large package, and only algorithm="native" needs its closed forms
    from minidist.estimate.comm import SUPPORTED, collective_time

    if c.size > 1:
        alg = choose(coll, nbytes, c)
        alg = alg if alg in SUPPORTED.get(coll, ()) else "ring"
        nodes = {c.node(i) for i in range(c.size)}
        link = c.cluster.inter_link if len(nodes) > 1 else c.cluster.intra_link
        c.advance(collective_time(coll, total, c.size, link.alpha, link.beta, alg))


@_native("all_reduce")
def all_reduce(c, buf: np.ndarray, op: ReduceOp) -> None:
    comm = _comm(c)
    c.wait_request(comm.Iallreduce(_mpi().IN_PLACE, buf, op=_OPS[op]))
    _charge(c, "all_reduce", buf.nbytes, buf.nbytes)


@_native("broadcast")
def broadcast(c, buf: np.ndarray, root: int) -> None:
    c.wait_request(_comm(c).Ibcast(buf, root=root))
    _charge(c, "broadcast", buf.nbytes, buf.nbytes)


@_native("reduce")
def reduce(c, buf: np.ndarray, root: int, op: ReduceOp) -> None:
    comm = _comm(c)
    send = _mpi().IN_PLACE if c.rank == root else buf
    c.wait_request(comm.Ireduce(send, buf if c.rank == root else None, op=_OPS[op], root=root))
    _charge(c, "reduce", buf.nbytes, buf.nbytes)


@_native("scatter")
def scatter(c, out: np.ndarray, chunks, root: int) -> None:
    comm = _comm(c)
    send = np.concatenate(chunks) if c.rank == root else None
    c.wait_request(comm.Iscatter(send, out, root=root))
    _charge(c, "scatter", out.nbytes, out.nbytes * c.size)


@_native("gather")
def gather(c, inp: np.ndarray, chunks, root: int) -> None:
    comm = _comm(c)
    recv = np.empty(inp.size * c.size, inp.dtype) if c.rank == root else None
    c.wait_request(comm.Igather(inp, recv, root=root))
    if c.rank == root:
        for i, part in enumerate(np.split(recv, c.size)):
            chunks[i][...] = part
    _charge(c, "gather", inp.nbytes, inp.nbytes * c.size)


@_native("all_gather")
def all_gather(c, outs: list, inp: np.ndarray) -> None:
    recv = np.empty(inp.size * c.size, inp.dtype)
    c.wait_request(_comm(c).Iallgather(inp, recv))
    for i, part in enumerate(np.split(recv, c.size)):
        outs[i][...] = part
    _charge(c, "all_gather", inp.nbytes, inp.nbytes * c.size)


@_native("reduce_scatter")
def reduce_scatter(c, out: np.ndarray, ins: list, op: ReduceOp) -> None:
    send = np.concatenate(ins)
    c.wait_request(_comm(c).Ireduce_scatter_block(send, out, op=_OPS[op]))
    _charge(c, "reduce_scatter", out.nbytes, out.nbytes * c.size)


@_native("all_to_all")
def all_to_all(c, outs: list, ins: list) -> None:
    from mpi4py.util.dtlib import from_numpy_dtype

    dtype = ins[0].dtype
    mtype = from_numpy_dtype(dtype)
    send = np.concatenate(ins) if ins else np.empty(0, dtype)
    recv = np.empty(sum(o.size for o in outs), dtype)
    scounts = [a.size for a in ins]
    rcounts = [o.size for o in outs]
    sdispl = np.concatenate([[0], np.cumsum(scounts)[:-1]]).astype(int).tolist()
    rdispl = np.concatenate([[0], np.cumsum(rcounts)[:-1]]).astype(int).tolist()
    c.wait_request(_comm(c).Ialltoallv([send, (scounts, sdispl), mtype], [recv, (rcounts, rdispl), mtype]))
    for o, a, n in zip(outs, rdispl, rcounts):
        o[...] = recv[a : a + n]
    _charge(c, "all_to_all", max(scounts, default=0) * dtype.itemsize, send.nbytes)


@_native("barrier")
def barrier(c) -> None:
    c.wait_request(_comm(c).Ibarrier())
    if c.size > 1:
        link = c.cluster.intra_link if len({c.node(i) for i in range(c.size)}) == 1 else c.cluster.inter_link
        c.advance((c.size - 1).bit_length() * link.alpha)  # a dissemination barrier: ceil(log2 p) rounds of alpha
