"""MPI's own collectives behind minidist's API: the cross-check of the learner's algorithms.

Under the MPI backend every collective also takes ``algorithm="native"`` (the table ``NATIVE``, kept
apart from ``ALGORITHMS``): the data moves by the MPI library's implementation (MPICH picks its own
algorithm by size and group) on a communicator of the group's ranks, by MPI's blocking call (``Allreduce``,
``Allgather``, ...: MPICH's fastest paths) on the caller's own buffers once the check below has shown every rank of
the group at the same call. That check is started non-blocking and is where a rank that never comes is waited for,
with the transport's timeout, so the blocking call cannot wait for an absent rank (a rank that dies meanwhile takes
the MPI job down with it). The answer must agree with minidist's algorithms up to rounding: MPI
may combine the ranks' buffers in another order, and float addition is not associative (chapter 11),
so equality is to a tolerance, not bitwise.

MPI's collectives trust their callers: ranks that pass different lengths, dtypes or roots get garbage,
partial sums or a wait that only times out. So before the data moves the group's ranks compare the call's
signature (the one minidist's own algorithms send with every message: shape, dtype, op, root, algorithm,
group) by a 63-bit hash of it, in one all-reduce of two integers (the maximum of ``h`` and of ``-h``: equal
only if every rank's ``h`` is the same). Only when they differ do the ranks exchange the signatures' text, and
all of them raise the simulator's ``MismatchError``, naming each call and the ranks that made it. An all-to-all
also exchanges its counts, since the signature allows uneven splits. The check is also where a rank that never
comes is caught; the data then moves straight between the caller's buffers (the whole buffer behind the pieces
minidist's API hands an algorithm), with no copy.

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

# bytes each rank contributes to the naming of disagreeing calls: its signature's crc32 and length, then as much
# of its text as fits (a fixed size, so that ranks that disagree about everything still exchange the same counts)
SIG_RECORD = 256
_HEAD = 8

_OPS: dict = {}
_MPI: list = []
_HASHES: dict = {}  # signature -> [h, -h] (int64), the check's contribution
_CHARGES: dict = {}  # (collective, nbytes, total, ranks, cluster) -> the closed form's seconds

#: collective -> MPI's own implementation (kept apart from ALGORITHMS: the simulator cannot run them)
NATIVE: dict = {}


def _native(collective: str):
    def deco(fn):
        NATIVE[collective] = fn
        return fn

    return deco


def _mpi():
    if not _MPI:
        from mpi4py import MPI  # optional: only a rank under the MPI backend gets here

        _OPS.update({ReduceOp.SUM: MPI.SUM, ReduceOp.PRODUCT: MPI.PROD, ReduceOp.MIN: MPI.MIN,
                     ReduceOp.MAX: MPI.MAX, ReduceOp.BAND: MPI.BAND, ReduceOp.BOR: MPI.BOR,
                     ReduceOp.BXOR: MPI.BXOR})
        _MPI.append(MPI)
    return _MPI[0]


def _comm(c, check: bool = True):
    group_comm = getattr(c._tp, "group_comm", None)
    if group_comm is None:
        raise ValueError(f"{c.name}: algorithm='native' runs MPI's own collective, so it needs the MPI backend "
                         f"(md.launch(..., backend='mpi') or md.dist.init(backend='mpi'))")
    _mpi()
    comm = group_comm(c.ranks)
    if check and c.size > 1:
        _agree(c, comm)
    return comm


def _wait(c, req) -> None:
    """``c.wait_request(req)``, its wait's name spelled only if the request does not complete while polled."""
    if not c._tp.spin_native(req):
        c.wait_request(req)


def _hash(sig: bytes) -> np.ndarray:
    mine = _HASHES.get(sig)
    if mine is None:
        if len(_HASHES) > 4096:
            _HASHES.clear()
        h = (zlib.crc32(sig) << 31) ^ zlib.adler32(sig) ^ (len(sig) << 48)
        h &= (1 << 62) - 1
        mine = _HASHES[sig] = np.array([h, -h], np.int64)
    return mine


def _whole(parts, dtype) -> np.ndarray:
    """The one flat buffer behind ``parts`` (``comm.pieces``: no copy), else their concatenation."""
    whole = getattr(parts, "whole", None)
    if whole is not None and parts.starts[-1] == whole.size and whole.flags.c_contiguous:
        return whole
    return np.concatenate(parts) if len(parts) else np.empty(0, dtype)


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


def _agree(c, comm, even: int = 0) -> bool:
    """Every rank of the group made the same call, or every one of them raises MismatchError naming the calls.

    ``even``: an all-to-all's block size when every block it sends and receives has it (0 otherwise), mixed into
    the hash: ranks that agree on it need no exchange of counts. Returns whether the ranks agree on it too (when
    they agree on the call but not on that, the counts are compared next). No simulated time passes (as for the
    simulator's signature check): it stands for the check that minidist's own algorithms get free with their
    messages.
    """
    mine = _hash(c._sig)
    if even:
        mine = mine + np.array([even, -even], np.int64)
    got = np.empty(2, np.int64)
    _wait(c, comm.Iallreduce(mine, got, op=_MPI[0].MAX))
    if got[0] == -got[1]:  # the largest h is the smallest: every rank's is the same (every rank sees the same)
        return True
    mine = _record(c._sig)
    table = np.empty((c.size, SIG_RECORD), np.uint8)
    c.wait_request(comm.Iallgather(mine, table))
    if (table == mine).all():
        return False  # the same call, with other block sizes: for the counts to name
    calls: dict[bytes, list[int]] = {}  # record -> the global ranks that made that call, in rank order
    for i in range(c.size):
        calls.setdefault(table[i].tobytes(), []).append(c.ranks[i])
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
    _wait(c, comm.Iallgather(mine, got))
    sent, recv = got[:, : c.size], got[:, c.size :]
    bad = np.argwhere(sent != recv.T)
    if len(bad):
        a, b = (int(x) for x in bad[0])
        n, m = int(sent[a, b]), int(recv[b, a])
        raise MismatchError(misfit(c.name, c.ranks[a], c.ranks[b], -1, ((n,), dtype, n * itemsize),
                                   ((m,), dtype, m * itemsize)))


def _charge(c, coll: str, nbytes: int, total: int) -> None:
    """Move the cursor by the closed form of the algorithm minidist would have run."""
    if c.size > 1:
        key = (coll, nbytes, total, c.ranks, id(c.cluster))
        hit = _CHARGES.get(key)
        if hit is None or hit[0] is not c.cluster:
            # imported here: the estimator is a large package, and only algorithm="native" needs its closed forms
            from minidist.estimate.comm import SUPPORTED, collective_time

            alg = choose(coll, nbytes, c)
            alg = alg if alg in SUPPORTED.get(coll, ()) else "ring"
            nodes = {c.node(i) for i in range(c.size)}
            link = c.cluster.inter_link if len(nodes) > 1 else c.cluster.intra_link
            if len(_CHARGES) > 4096:
                _CHARGES.clear()
            hit = _CHARGES[key] = (c.cluster, collective_time(coll, total, c.size, link.alpha, link.beta, alg))
        c.advance(hit[1])


@_native("all_reduce")
def all_reduce(c, buf: np.ndarray, op: ReduceOp) -> None:
    comm = _comm(c)
    comm.Allreduce(_MPI[0].IN_PLACE, buf, op=_OPS[op])
    _charge(c, "all_reduce", buf.nbytes, buf.nbytes)


@_native("broadcast")
def broadcast(c, buf: np.ndarray, root: int) -> None:
    _comm(c).Bcast(buf, root=root)
    _charge(c, "broadcast", buf.nbytes, buf.nbytes)


@_native("reduce")
def reduce(c, buf: np.ndarray, root: int, op: ReduceOp) -> None:
    comm = _comm(c)
    send = _MPI[0].IN_PLACE if c.rank == root else buf
    comm.Reduce(send, buf if c.rank == root else None, op=_OPS[op], root=root)
    _charge(c, "reduce", buf.nbytes, buf.nbytes)


@_native("scatter")
def scatter(c, out: np.ndarray, chunks, root: int) -> None:
    comm = _comm(c)
    send = _whole(chunks, out.dtype) if c.rank == root else None
    comm.Scatter(send, out, root=root)
    _charge(c, "scatter", out.nbytes, out.nbytes * c.size)


@_native("gather")
def gather(c, inp: np.ndarray, chunks, root: int) -> None:
    comm = _comm(c)
    recv = None
    if c.rank == root:
        whole = getattr(chunks, "whole", None)
        direct = whole is not None and chunks.starts[-1] == whole.size and whole.flags.c_contiguous
        recv = whole if direct else np.empty(inp.size * c.size, inp.dtype)
    comm.Gather(inp, recv, root=root)
    if c.rank == root and recv is not getattr(chunks, "whole", None):
        for i, part in enumerate(np.split(recv, c.size)):
            chunks[i][...] = part
    _charge(c, "gather", inp.nbytes, inp.nbytes * c.size)


@_native("all_gather")
def all_gather(c, outs: list, inp: np.ndarray) -> None:
    whole = getattr(outs, "whole", None)
    direct = whole is not None and outs.starts[-1] == whole.size and whole.flags.c_contiguous
    recv = whole if direct else np.empty(inp.size * c.size, inp.dtype)
    _comm(c).Allgather(inp, recv)
    if not direct:
        for i, part in enumerate(np.split(recv, c.size)):
            outs[i][...] = part
    _charge(c, "all_gather", inp.nbytes, inp.nbytes * c.size)


@_native("reduce_scatter")
def reduce_scatter(c, out: np.ndarray, ins: list, op: ReduceOp) -> None:
    send = _whole(ins, out.dtype)
    _comm(c).Reduce_scatter_block(send, out, op=_OPS[op])
    _charge(c, "reduce_scatter", out.nbytes, out.nbytes * c.size)


@_native("all_to_all")
def all_to_all(c, outs: list, ins: list) -> None:
    from mpi4py.util.dtlib import from_numpy_dtype

    dtype = ins[0].dtype
    send = _whole(ins, dtype)
    oall = getattr(outs, "whole", None)
    direct = oall is not None and outs.starts[-1] == oall.size and oall.flags.c_contiguous
    recv = oall if direct else np.empty(sum(o.size for o in outs), dtype)
    scounts = [a.size for a in ins]
    rcounts = [o.size for o in outs]
    comm = _comm(c, check=False)
    even = scounts[0] if len(set(scounts)) == 1 and scounts == rcounts else 0
    if c.size > 1:  # alike on every rank: whether all of them agree on the call and on its even block size
        even = even if _agree(c, comm, even + 1 if even else 0) else 0
        if not even:
            _agree_counts(c, comm, scounts, rcounts, dtype.itemsize, dtype)
    if even:
        comm.Alltoall(send, recv)  # even blocks, the same on every rank: MPI's all-to-all, no count vectors
    else:
        mtype = from_numpy_dtype(dtype)
        sdispl = np.concatenate([[0], np.cumsum(scounts)[:-1]]).astype(int).tolist()
        rdispl = np.concatenate([[0], np.cumsum(rcounts)[:-1]]).astype(int).tolist()
        comm.Alltoallv([send, (scounts, sdispl), mtype], [recv, (rcounts, rdispl), mtype])
    if not direct:
        a = 0
        for o in outs:
            o[...] = recv[a : a + o.size]
            a += o.size
    _charge(c, "all_to_all", max(scounts, default=0) * dtype.itemsize, send.nbytes)


@_native("barrier")
def barrier(c) -> None:
    _comm(c)  # the agreement check is an all-reduce every rank must join: a barrier already
    if c.size > 1:
        link = c.cluster.intra_link if len({c.node(i) for i in range(c.size)}) == 1 else c.cluster.inter_link
        c.advance((c.size - 1).bit_length() * link.alpha)  # a dissemination barrier: ceil(log2 p) rounds of alpha
