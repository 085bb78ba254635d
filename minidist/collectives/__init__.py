"""Collectives built from point-to-point steps, one file per algorithm family (chapters 11-13a).

The public functions (``md.dist.all_reduce`` and friends, in ``api.py``) check their arguments,
pick an algorithm (``algorithm=`` or ``choose``), and call the algorithm with a ``Comm``. An
algorithm only moves data between group-local ranks; its simulated time follows from the
messages it sends, and must match the closed form for that algorithm.

Writing an algorithm file
-------------------------
Register one function per collective with ``@register(collective, name)``::

    from minidist.collectives.registry import register

    @register("all_reduce", "ring")
    def all_reduce(c: Comm, buf: np.ndarray, op: ReduceOp) -> None: ...

The functions and what they receive (arrays are C-contiguous; ``root`` is a group-local index):

==================  =====================================================================================
``all_reduce``      ``(c, buf, op)``: ``buf`` is the flat 1-D buffer; leave the reduction of every rank's
                    ``buf`` in it on every rank.
``broadcast``       ``(c, buf, root)``: flat ``buf``; copy root's ``buf`` into everyone's.
``reduce``          ``(c, buf, root, op)``: flat ``buf``; the reduction must end in root's ``buf``. On
                    other ranks ``buf`` is a private scratch copy: overwrite it freely.
``scatter``         ``(c, out, chunks, root)``: ``chunks`` (root only, else None) is a list of ``size``
                    arrays shaped like ``out``; rank i gets ``chunks[i]`` in ``out``.
``gather``          ``(c, inp, chunks, root)``: ``chunks`` (root only, else None) receives rank i's
                    ``inp`` in ``chunks[i]``.
``all_gather``      ``(c, outs, inp)``: ``outs`` is a list of ``size`` arrays shaped like ``inp``
                    (for ``all_gather_into_tensor`` they are consecutive views of one buffer);
                    every rank gets rank i's ``inp`` in ``outs[i]`` (including its own).
``reduce_scatter``  ``(c, out, ins, op)``: ``ins`` is a list of ``size`` scratch arrays (a private copy
                    of the input, consecutive views of one flat buffer; overwrite freely); rank i ends
                    with the reduction over ranks of ``ins[i]`` in ``out``.
``all_to_all``      ``(c, outs, ins)``: lists of ``size`` arrays (sizes may differ, some may be empty);
                    rank j's ``ins[i]`` lands in rank i's ``outs[j]``.
``barrier``         ``(c)``: return only after every rank has entered.
==================  =====================================================================================

``op`` is never AVG (the caller reduces with SUM and divides once afterwards). ``c`` gives:

* ``c.rank``, ``c.size``, ``c.ranks`` (global ranks by group index), ``c.cluster``,
  ``c.node(i)`` and ``c.link(i, j)`` (topology), ``c.name`` (the collective being run);
* ``c.isend(buf, peer, tag=0)`` and ``c.irecv(buf, peer, tag=0, op=None)`` return handles; with
  ``op`` the receive reduces into ``buf`` straight from shared memory (no temporary). ``buf`` must be
  C-contiguous (a slice of a flat buffer is); do not touch a send buffer until it is waited. A
  send handle completes (in real time) once its bytes are in the channel, it does not wait for the
  receiver (except for a message above ``transport.RENDEZVOUS_BYTES``, 256 KB, which the receiver
  reads straight from the sender's buffer: that send completes when the read is done, so an
  algorithm must never need a send to finish before its peer posts the receive; a test runs every
  algorithm with every message read that way); every message carries the
  call's signature, so a disagreeing receiver refuses the data and every rank raises;
* ``c.wait(*handles)`` blocks until they complete and moves the cursor ``c.now`` to the latest
  completion. ``c.send``, ``c.recv`` and ``c.sendrecv(sendbuf, dst, recvbuf, src, tag=0, op=None)``
  are the blocking forms (``sendrecv`` runs both at once: one step of a ring);
* ``c.exchange(sends, recvs=(), chain=False)`` sends every ``(buf, peer)`` of ``sends`` and receives every
  ``(buf, peer)`` of ``recvs`` at once (no ``op``): the times of an ``isend``/``irecv`` each and one ``wait``,
  or with ``chain`` of one ``send`` after another; small messages are posted together and what has arrived
  is read in one pass, so a step that talks to many peers costs little more than one message each
  (``direct.py`` uses it);
* ``c.wait_times(*handles, meanwhile=None)`` moves the cursor as ``wait`` would but needs only each
  message's simulated times (a receive's come with its header), not its bytes; with
  ``irecv(..., held=True)`` a receive takes its bytes only after that, so a rank offers its next
  step's send first (``pairwise.py`` does this for large blocks). Wait the handles before using the
  buffers;
* ``c.sub(members)`` a Comm over a subset (group-local indices) sharing the cursor, for
  hierarchical algorithms; every member must call it with the same list.

Costs: a message of n bytes from group rank i to j starts at ``max(c.now when issued, link free)``
and arrives ``alpha + n / beta`` later on ``c.link(i, j)``; a receive completes at
``max(c.now when posted, arrival)``. Each ordered pair of ranks is its own link, so a rank can send
to its left and right neighbours at once (full duplex) while two messages to the same peer queue.
Tags 0..63 separate concurrent message streams between the same two ranks (same-tag messages
between a pair are received in the order they were sent).

``choose(collective, nbytes, c)`` returns the default algorithm name; ``ALGORITHMS[collective]``
maps names to functions. ``direct.py`` has a naive root-based version of every collective.
"""

from __future__ import annotations

import math

from minidist.collectives.registry import ALGORITHMS, COLLECTIVES, register  # noqa: F401  (the package's names)


def finishes_with_root(collective: str, algorithm: str, p: int) -> bool:
    """Whether every member of a ``p``-rank broadcast or scatter by ``algorithm`` ends it when the root does (all
    starting together, on alike links).

    When one rank stands for others (representatives), a root that only sends hears nothing from the ranks it
    stands for; their clocks are taken to end where its own does, which is exact only then. A binomial tree on a
    power of two delivers its last messages in its last step, to every rank at once; a chain, a direct fan-out or
    a lopsided tree leaves some ranks done before others. (Checked against runs of every rank in
    tests/test_shape_only_train.py.) Two ranks always finish together."""
    return p <= 2 or (algorithm == "tree" and collective in ("broadcast", "scatter") and p & (p - 1) == 0)


def available(collective: str) -> list[str]:
    return sorted(ALGORITHMS[collective])


def offered(collective: str, algorithm: str | None) -> str | None:
    """``algorithm`` if ``collective`` has it, else None (the runtime's own choice).

    A training layout names one algorithm for all its collectives, as NCCL_ALGO does: the gradient
    all-reduce takes it, and a broadcast or all-to-all that has no such algorithm keeps the default.
    ``"native"`` (MPI's own collectives, under the MPI backend) is offered by every collective.
    """
    if algorithm == "native":
        return algorithm
    return algorithm if algorithm in ALGORITHMS[collective] else None


def known_algorithms() -> list[str]:
    """Every algorithm some collective offers."""
    return sorted({name for table in ALGORITHMS.values() for name in table})


def crossover_bytes(p: int, alpha: float, beta: float) -> float:
    """Buffer size above which the ring all-reduce beats the binomial tree on ``p`` ranks (chapter 12):
    n* = alpha beta (2(p-1) - 2 lg p) / (2 lg p - 2(p-1)/p); 0 for p <= 2, where they coincide.
    The same number as ``md.estimate.ring_tree_crossover_bytes``."""
    if p <= 2:
        return 0.0
    lg = math.log2(p)
    return alpha * beta * (2 * (p - 1) - 2 * lg) / (2 * lg - 2 * (p - 1) / p)


_ROOTED = {"broadcast": "tree", "reduce": "tree", "scatter": "tree", "gather": "tree",
           "all_to_all": "pairwise", "barrier": "direct"}


def _latency_bound_all_reduce(p: int, n: float, alpha: float, beta: float) -> str:
    """recursive_doubling or halving_doubling, whichever has the smaller alpha-beta time on p ranks."""
    q = 1 << (p.bit_length() - 1)
    k = q.bit_length() - 1
    fold = 2 * (alpha + n / beta) if q < p else 0.0
    doubling = fold + k * (alpha + n / beta)
    rabenseifner = fold + 2 * k * alpha + 2 * (q - 1) / q * n / beta
    return "recursive_doubling" if doubling <= rabenseifner else "halving_doubling"


def choose(collective: str, nbytes: int, c) -> str:
    """The default algorithm for ``collective`` over the group of ``c``, chosen like NCCL does.

    Every rank must reach the same answer, so ``nbytes`` is a size all ranks agree on: the buffer
    (all_reduce, broadcast, reduce), one rank's piece (scatter, gather, all_gather: the input;
    reduce_scatter: the output) or, for all_to_all, the bytes of one row of the dim-0 split.

    * broadcast, reduce, scatter, gather: the binomial tree (log2 p rounds instead of p-1);
      all_to_all: pairwise exchange; barrier: direct.
    * all_reduce, all_gather, reduce_scatter of n bytes in all (p times the piece for the last two),
      with alpha and beta of the slowest link the group uses:

      - below the ring/tree crossover n* (``crossover_bytes``: alpha beta times a factor that grows
        like p / log2 p; for p = 2, where that is 0, n* = alpha beta) the message is latency-bound
        and gets log2 p steps: all-reduce by recursive doubling or halving-doubling, whichever has
        the smaller alpha-beta time (doubling, for every n below n* we have met), all-gather and
        reduce-scatter by halving-doubling;
      - above n* the ring: bandwidth-optimal, and it only ever talks to its neighbours, which is why
        NCCL prefers it for large messages on real networks (the simulated crossbar has no
        contention, so there halving-doubling would do as well);
      - an all-reduce above n* whose group spans several nodes, with as many of its ranks on each,
        joined by a network slower than the node's links: hierarchical (intra-node reduce-scatter,
        inter-node all-reduce of n/G, intra-node all-gather).

    Inside a DGX H100 node (NVLink4: alpha 1 us, beta 450 GB/s) n* = 0.85 MB for p = 8; over IB NDR400
    (2 us, 50 GB/s) 0.19 MB: the same order as NCCL's switch from tree to ring (256 kB to 4 MB).
    """
    fixed = _ROOTED.get(collective)
    if fixed is not None:
        return fixed
    p = c.size
    if p == 1:
        return "ring"
    cl = c.cluster
    nodes: dict[int, int] = {}
    for i in range(p):
        n_i = c.node(i)
        nodes[n_i] = nodes.get(n_i, 0) + 1
    link = cl.inter_link if len(nodes) > 1 else cl.intra_link
    full = nbytes if collective == "all_reduce" else nbytes * p
    n_star = crossover_bytes(p, link.alpha, link.beta) if p > 2 else link.alpha * link.beta
    if full < n_star:
        if collective == "all_reduce":
            return _latency_bound_all_reduce(p, full, link.alpha, link.beta)
        return "halving_doubling" if p > 2 else "ring"
    slower = cl.inter_link.beta < cl.intra_link.beta or cl.inter_link.alpha > cl.intra_link.alpha
    if collective == "all_reduce" and len(nodes) > 1 and slower and len(set(nodes.values())) == 1:
        return "hierarchical"
    return "ring"


# importing a file registers its algorithms
from minidist.collectives import (  # noqa: E402,F401
    bidirectional_ring,
    direct,
    halving_doubling,
    hierarchical,
    pairwise,
    ring,
    tree,
)
