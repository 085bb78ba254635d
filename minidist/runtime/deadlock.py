"""Deadlocks found in a second, not after the timeout: a cycle of ranks, each blocked on the next.

Every rank that blocks in a communication call writes on the board whom it waits for, and counts
the times its wait moved data. A rank blocked for a while follows those edges from itself: if they
lead back to it through ranks that are all blocked, and a moment later the same ranks are still in
the same waits with the same counts, each having looked at its channels again in between (a rank that a busy
machine, or a SIGSTOP, kept from running has not looked, and may yet find its message), no rank of the cycle can
ever be woken by another: a deadlock.
Typical causes are two receives posted before their sends, and ranks that disagree about which
group a collective runs on (each waits in its own version of the call).
"""

from __future__ import annotations

from minidist.runtime import shm

R_MOVES, R_WAITN, R_WAITFOR, MAX_PEERS = 2, 3, 56, 8  # board record words (see shm.py's record layout)
R_LOOKS = (shm.G_OFF + shm.G_SLOTS * shm.G_BYTES) // 8  # after the collectives' table: a blocked rank's looks
UNFINISHED = "left unfinished when fn returned"  # how a wait of Transport.flush describes itself


def publish_waits(board: shm.Board, rank: int, peers) -> None:
    """Record that ``rank`` is blocked until each of ``peers`` acts (the first few of them)."""
    w = board.rec[rank]
    peers = sorted(set(peers))[:MAX_PEERS]
    for i, p in enumerate(peers):
        board.q[w + R_WAITFOR + i] = p
    board.q[w + R_WAITN] = len(peers)


def moved(board: shm.Board, rank: int) -> None:
    board.q[board.rec[rank] + R_MOVES] += 1


def _waits(board: shm.Board, r: int) -> list[int]:
    w = board.rec[r]
    if board.q[w + shm.R_STATE] != shm.WAITING:
        return []
    n = min(int(board.q[w + R_WAITN]), MAX_PEERS)
    return [int(board.q[w + R_WAITFOR + i]) for i in range(n)]


def find_cycle(board: shm.Board, me: int) -> list[int] | None:
    """A cycle of blocked ranks through ``me`` (in wait-for order, starting at ``me``), or None."""
    path, on_path, seen = [me], {me}, set()

    def walk(r: int) -> list[int] | None:
        for p in _waits(board, r):
            if p == me:
                return list(path)
            if p in on_path or p in seen:
                continue
            seen.add(p)
            path.append(p)
            on_path.add(p)
            found = walk(p)
            if found:
                return found
            path.pop()
            on_path.discard(p)
        return None

    return walk(me)


def looked(board: shm.Board, rank: int) -> None:
    """Count one look of a blocked ``rank`` at its channels (it was running then, whatever it found)."""
    board.q[board.rec[rank] + R_LOOKS] += 1


def looks(board: shm.Board, cycle: list[int]) -> tuple:
    return tuple(board.q[board.rec[r] + R_LOOKS] for r in cycle)


def snapshot(board: shm.Board, cycle: list[int]) -> tuple:
    """What must stay unchanged for the cycle to be stuck: each rank's wait (since) and its move count."""
    return tuple((r, board.d[board.rec[r] + shm.R_SINCE], board.q[board.rec[r] + R_MOVES]) for r in cycle)


def describe(board: shm.Board, cycle: list[int]) -> str:
    """The cycle in words, and what usually causes such a cycle."""
    steps, calls, descs = [], set(), []
    for i, r in enumerate(cycle):
        _, _, desc = board.describe(r)
        descs.append(desc)
        sep = "," if desc.endswith(UNFINISHED) else ""
        steps.append(f"rank {r} waits in {desc}{sep} for rank {cycle[(i + 1) % len(cycle)]}")
        calls.add(desc.split(": ", 1)[0] if " on " in desc else "p2p")
    text = "deadlock: " + "; ".join(steps)
    if len(calls) > 1:
        text += (" (the ranks are in different calls: collectives on a group must be called by all its members "
                 "in the same order; do the ranks agree about each group's membership?)")
    elif all(d.endswith(UNFINISHED) for d in descs):
        text += (" (messages nobody matched: every isend needs a recv or irecv on its peer, and every irecv a "
                 "send; a send is done only when its peer has taken it)")
    elif calls == {"p2p"}:
        text += " (each waits for the other: a blocking receive or send on both sides before either answers?)"
    return text
