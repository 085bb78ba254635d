"""MPI's own collectives behind minidist's API: the cross-check of the learner's algorithms.

Under the MPI backend every collective also takes ``algorithm="native"`` (the table ``NATIVE``, kept
apart from ``ALGORITHMS``): the data moves by the MPI library's implementation (MPICH picks its own
algorithm by size and group) on a communicator of the group's ranks, started non-blocking so that the
wait times out like any other. The answer must agree with minidist's algorithms up to rounding: MPI
may combine the ranks' buffers in another order, and float addition is not associative (chapter 11),
so equality is to a tolerance, not bitwise.

MPI's collectives trust their callers: ranks that pass different lengths, dtypes or roots get garbage,
partial sums or a wait that only times out. So before the data moves the group's ranks exchange the call's
signature (the one minidist's own algorithms send with every message: shape, dtype, op, root, algorithm,
group) in one small all-gather of a fixed size, and ranks that disagree all raise the simulator's
``MismatchError``, naming each call and the ranks that made it. An all-to-all also exchanges its counts,
since the signature allows uneven splits.

MPI does not say which algorithm it ran, so the simulated clock is charged the closed form of the
algorithm ``choose`` would pick (the ring where the closed forms have no model for it, as for the
hierarchical all-reduce) on the slowest link the group uses: what minidist's own run would charge.
"""

from __future__ import annotations

import zlib

import numpy as np

from minidist.collectives import choose
from minidist.runtime.errors import MismatchError, misfit
from minidist.runtime.ops import ReduceOp

# bytes each rank contributes to the signature check: its signature's crc32 and length, then as much of its
# text as fits (a fixed size, so that ranks that disagree about everything still exchange the same counts)
SIG_RECORD = 256
_HEAD = 8

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
    comm = group_comm(c.ranks)
    if c.size > 1:
        _agree(c, comm)
    return comm


def _record(sig: bytes) -> np.ndarray:
    rec = np.zeros(SIG_RECORD, np.uint8)
    rec[:_HEAD] = np.array([zlib.crc32(sig), len(sig)], np.uint32).view(np.uint8)
    text = sig[: SIG_RECORD - _HEAD]
    rec[_HEAD : _HEAD + len(text)] = np.frombuffer(text, np.uint8)
    return rec


def _text(rec: np.ndarray) -> str:
    n = int(rec[:_HEAD].view(np.uint32)[1])
    room = SIG_RECORD - _HEAD
    text = rec[_HEAD : _HEAD + min(n, room)].tobytes().decode(errors="replace")
    return text + ("..." if n > room else "")


def _agree(c, comm) -> None:
    """Every rank of the group made the same call, or every one of them raises MismatchError naming the calls.

    No simulated time passes (as for the simulator's signature check): it stands for the check that minidist's
    own algorithms get free with their messages.
    """
    mine = _record(c._sig)
    got = np.empty((c.size, SIG_RECORD), np.uint8)
    c.wait_request(comm.Iallgather(mine, got))
    if (got == mine).all():
        return
    calls: dict[bytes, list[int]] = {}  # record -> the global ranks that made that call, in rank order
    for i in range(c.size):
        calls.setdefault(got[i].tobytes(), []).append(c.ranks[i])
    me = c.ranks[c.rank]
    # every rank words it alike but puts its own call last, as the simulator's "rank r called ...; rank me called"
    order = sorted(calls.items(), key=lambda kv: (me in kv[1], kv[1][0]))
    parts = [f"{'rank' if len(rs) == 1 else 'ranks'} {rs[0] if len(rs) == 1 else rs} called "
             f"{_text(np.frombuffer(rec, np.uint8))}" for rec, rs in order]
    raise MismatchError("ranks disagree about a collective call: " + "; ".join(parts))


def _agree_counts(c, comm, scounts: list[int], rcounts: list[int], itemsize: int, dtype) -> None:
    """An all-to-all's counts fit: what rank a sends rank b is what b receives from a (checked on every rank)."""
    mine = np.array(scounts + rcounts, np.int64)
    got = np.empty((c.size, 2 * c.size), np.int64)
    c.wait_request(comm.Iallgather(mine, got))
    sent, recv = got[:, : c.size], got[:, c.size :]
    bad = np.argwhere(sent != recv.T)
    if len(bad):
        a, b = (int(x) for x in bad[0])
        n, m = int(sent[a, b]), int(recv[b, a])
        raise MismatchError(misfit(c.name, c.ranks[a], c.ranks[b], -1, ((n,), dtype, n * itemsize),
                                   ((m,), dtype, m * itemsize)))


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
    comm = _comm(c)
    _agree_counts(c, comm, scounts, rcounts, dtype.itemsize, dtype)
    c.wait_request(comm.Ialltoallv([send, (scounts, sdispl), mtype], [recv, (rcounts, rdispl), mtype]))
    for o, a, n in zip(outs, rdispl, rcounts):
        o[...] = recv[a : a + n]
    _charge(c, "all_to_all", max(scounts, default=0) * dtype.itemsize, send.nbytes)


@_native("barrier")
def barrier(c) -> None:
    c.wait_request(_comm(c).Ibarrier())
    if c.size > 1:
        link = c.cluster.intra_link if len({c.node(i) for i in range(c.size)}) == 1 else c.cluster.inter_link
        c.advance((c.size - 1).bit_length() * link.alpha)  # a dissemination barrier: ceil(log2 p) rounds of alpha
