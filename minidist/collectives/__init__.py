"""Collectives built from point-to-point steps, one file per algorithm family (chapters 11-13a).

The public functions (``md.dist.all_reduce`` and friends, in ``api.py``) check their arguments,
pick an algorithm (``algorithm=`` or ``choose``), and call the algorithm with a ``Comm``. An
algorithm only moves data between group-local ranks; its simulated time follows from the
messages it sends, and must match the closed form for that algorithm.

Writing an algorithm file
-------------------------
Register one function per collective with ``@register(collective, name)``::

    from minidist.collectives import register

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
  receiver; the ranks' arguments were already published and every message carries the call's
  signature, so a disagreeing receiver refuses the data and every rank raises;
* ``c.wait(*handles)`` blocks until they complete and moves the cursor ``c.now`` to the latest
  completion. ``c.send``, ``c.recv`` and ``c.sendrecv(sendbuf, dst, recvbuf, src, tag=0, op=None)``
  are the blocking forms (``sendrecv`` runs both at once: one step of a ring);
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

from collections.abc import Callable

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "scatter", "gather", "all_gather", "reduce_scatter",
               "all_to_all", "barrier")

#: collective -> algorithm name -> function
ALGORITHMS: dict[str, dict[str, Callable]] = {name: {} for name in COLLECTIVES}


def register(collective: str, name: str) -> Callable[[Callable], Callable]:
    """Decorator: make ``fn`` available as ``algorithm=name`` for ``collective``."""
    if collective not in ALGORITHMS:
        raise ValueError(f"register: unknown collective {collective!r}; known: {COLLECTIVES}")

    def deco(fn: Callable) -> Callable:
        ALGORITHMS[collective][name] = fn
        return fn

    return deco


def available(collective: str) -> list[str]:
    return sorted(ALGORITHMS[collective])


def choose(collective: str, nbytes: int, c) -> str:
    """The default algorithm for ``collective`` over the group of ``c``.

    Every rank must reach the same answer, so ``nbytes`` is a size all ranks agree on: the buffer
    (all_reduce, broadcast, reduce), one rank's piece (scatter, gather, all_gather: the input;
    reduce_scatter: the output) or, for all_to_all, the bytes of one row of the dim-0 split.
    """
    return "direct"


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
