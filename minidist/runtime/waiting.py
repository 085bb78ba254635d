"""Waiting for messages: a short poll, then sleep on the doorbell; and the reports when a wait cannot end.

Waiting is cheap: one pipe per rank is its doorbell (``doorbell.py``). A rank about to sleep raises a flag on the
channels it waits on and looks once more; whoever changes a flagged channel rings the bell, and nobody rings a rank
that is busy (a wake-up costs far more than a message). Before sleeping a rank polls for a few tens of microseconds
(``transport.spin_seconds``), yielding its core at every look; a look reads the few control words that can move
what it waits for, and runs a progress pass only when one of them changed. Sleeps are timed, so a wait that cannot
end becomes an error: a peer failed, left or disagrees, a cycle of waiting ranks (``deadlock.py``), or the timeout,
reported with what every rank is doing.
"""

from __future__ import annotations

import time
import zlib

from minidist.runtime import deadlock, shm
from minidist.runtime.channels import fence
from minidist.runtime.errors import (
    CommTimeoutError,
    DeadlockError,
    MismatchError,
    PeerExitedError,
    RankAborted,
    process_state,
)
from minidist.runtime.messages import RecvOp, SendOp, _Stash, _Timing
from minidist.runtime.shm import C_HEAD, C_NACK, C_RWANT, C_TAIL, C_WANT, HEADER

# a timeout report looks again for this long at ranks it saw running: between two of its waits a waiting rank runs
# for a moment, and the report must not call it hung for that (the launcher's own deadline allows for it)
SETTLE_S = 0.25


def unreceived(peer: int, tag: int) -> str:
    """For a point-to-point send whose peer returned: what the program is missing (the in-process backend, which
    runs the peer's return first, says the same from the peer's side)."""
    if tag < 0:  # a collective's message: the peer skipped the collective, which other reports name
        return ""
    return f": rank {peer} returned from fn without a recv or irecv for it (every send needs one on its peer)"


class Waiting:
    """The Transport's waits (``wait``, ``wait_times``, ``flush``) and what they raise when a wait cannot end."""

    def _sleep(self, seconds: float) -> None:
        """Sleep on this rank's doorbell (at most ``seconds``); a wake-up swallows the rings that piled up."""
        self.bell.sleep(seconds)

    def wait(self, ops, timeout: float | None = None) -> None:
        """Block (on the doorbell, not spinning) until every op in ``ops`` is done.

        Before sleeping the rank raises a flag on each channel it waits on (C_RWANT for data, C_WANT
        for free slots) and looks once more; peers ring the bell only when they see a flag, so a
        rank that is busy is never disturbed. What it waits for is written on the board only when
        the wait lasts (reports need it after seconds, the fast path should not pay for it).
        """
        for op in ops:
            if not op.done:
                break
        else:
            if self.failed:
                self._raise_failed(ops)
            return
        for op in ops:
            if op.__class__ is RecvOp and op.held:
                op.held = False
        timeout = self.timeout if timeout is None else timeout
        t0 = time.monotonic()
        deadline = t0 + timeout
        blocked = described = False
        flags = []
        if self.spin and self._spin(ops, t0 + self.spin):  # a short poll before sleeping
            if self.failed:
                self._raise_failed(ops)
            return
        suspect = None
        try:
            while True:
                if self.progress() and blocked:
                    deadlock.moved(self.board, self.rank)
                    if described:  # what it waits for may have shrunk: a stale edge would close a false cycle
                        self.board.set_desc(self.rank, self._what(ops))
                        deadlock.publish_waits(self.board, self.rank, [op.peer for op in ops if not op.done])
                if self.failed:
                    self._raise_failed(ops)
                if all(op.done for op in ops):
                    return
                now = time.monotonic()
                self._check_peers(ops, slow=now - t0 > 0.05)
                if now >= deadline:
                    raise CommTimeoutError(self._report(ops, now - t0), self._states())
                if described and now - t0 > 0.5:
                    suspect = self._check_deadlock(suspect, now)
                if not blocked:
                    blocked = True
                    self.board.set_waiting(self.rank, time.time())
                    flags = [(self.out_ctrl[d], C_WANT) for d in self.send_q]
                    flags += [(self.in_ctrl[s], C_RWANT) for s in set(self.recv_q) | set(self.cur_in)]
                    for c, w in flags:
                        c[w] = 1
                    fence()
                    continue  # look once more now that peers can see the flags: no lost wake-up
                if not described and now - t0 > 0.05:
                    described = True
                    self.board.set_desc(self.rank, self._what(ops))
                    deadlock.publish_waits(self.board, self.rank, [op.peer for op in ops if not op.done])
                self._sleep(min(deadline - now, 0.05 if not described else 0.25))
                deadlock.looked(self.board, self.rank)
        finally:
            if blocked:
                for c, w in flags:
                    c[w] = 0
                self.board.set_state(self.rank, shm.RUNNING)

    def _words(self) -> list:
        """The control words whose change is the only thing that can move a pending op: the head of each
        channel a receive waits on, the tail and refusal word of each channel a send waits on."""
        words = [(self.in_ctrl[s], C_HEAD) for s in self.recv_q]
        words += [(self.in_ctrl[s], C_HEAD) for s in self.cur_in if s not in self.recv_q]
        for d in self.send_q:
            words += [(self.out_ctrl[d], C_TAIL), (self.out_ctrl[d], C_NACK)]
        return words

    def _spin(self, ops, until: float) -> bool:
        """Poll until every op in ``ops`` is done (True) or ``until`` passes (False), yielding the core at each
        look (see spin_seconds). A look reads the few words that can move (``_words``) in one pass; the
        progress pass over the queues runs only when one of them changed."""
        pause = self.pause
        while True:
            self.progress()
            for op in ops:
                if not op.done:
                    break
            else:
                return True
            if self.failed:
                return False
            words = self._words()
            seen = [c[i] for c, i in words]
            while True:
                if time.monotonic() >= until:
                    return False
                if pause is not None:
                    pause()
                if [c[i] for c, i in words] != seen:
                    break

    def wait_times(self, ops, meanwhile=None) -> bool:
        """Wait until every op's simulated end is known: a send's is from the start, a receive's once its
        header is in. A held receive is then released: its bytes are taken by any later progress pass
        (``wait`` finishes them). ``meanwhile()``, if given, runs first when a time is not known yet
        (local work instead of an idle wait); returns whether it ran."""
        pending = [op for op in ops if op.__class__ is RecvOp and not op.done and op.hdr is None]
        ran = False
        if pending and meanwhile is not None:
            self.progress()
            pending = [op for op in pending if not op.done and op.hdr is None]
            if pending:
                meanwhile()
                ran = True
        if pending:
            self.wait([_Timing(op) for op in pending])
        for op in ops:
            if op.error is not None and op in self.failed:
                self.wait([op])  # raises what went wrong
            if op.__class__ is RecvOp:
                op.held = False
        return ran

    def _raise_failed(self, ops) -> None:
        for op in ops:
            if op.error is not None and op in self.failed:
                self.failed.remove(op)
                raise MismatchError(op.error)

    def _what(self, ops) -> str:
        waiting = [op.describe() for op in ops if not op.done]
        what = ", ".join(waiting[:4]) + (f" (+{len(waiting) - 4} more)" if len(waiting) > 4 else "")
        if self.coll is not None:  # name the call and its group: ranks may disagree about either
            what = f"{self.coll[3].decode(errors='replace')}: {what}"
        return f"{what}, {deadlock.UNFINISHED}" if self.finishing else what

    def _check_deadlock(self, suspect, now: float):
        """Raise DeadlockError if a cycle of blocked ranks through this one has not moved since the last look.

        Returns what to compare with at the next look (None: no cycle now).
        """
        cycle = deadlock.find_cycle(self.board, self.rank)
        if cycle is None:
            return None
        snap, looks = deadlock.snapshot(self.board, cycle), deadlock.looks(self.board, cycle)
        if suspect is None or suspect[0] != snap:
            return snap, now, looks
        if now - suspect[1] >= 0.3 and all(a > b for a, b in zip(looks, suspect[2])):  # each ran, and found nothing
            raise DeadlockError(deadlock.describe(self.board, cycle))
        return suspect

    def _check_peers(self, ops, slow: bool = True) -> None:
        """Turn a wait that can never end into an error: another rank failed, finished or disagrees.

        The board's collective records are compared only once the wait is ``slow``: when ranks
        disagree their messages usually meet and are refused long before.
        """
        board = self.board
        if board.q[0]:  # the abort word
            self._last_words(ops)
            msg = board.aborted()
            if board.abort_is_mismatch():
                raise MismatchError(msg)
            raise RankAborted(f"rank {self.rank} stopped because {msg}")
        for op in ops:
            if op.done:
                continue
            st = board.state(op.peer)
            if st == shm.FINISHED or st == shm.FAILED:
                self._last_words(ops)
                if op.done:  # (a held receive's header counts, though taking it moved nothing)
                    continue
                self._raise_if_mismatch()
                raise PeerExitedError(
                    f"rank {self.rank} waits in {op.describe()} but rank {op.peer} has "
                    f"{shm.STATE_NAMES[st]} and will never {'receive' if isinstance(op, SendOp) else 'send'} it"
                    + self._unclaimed(op) + self._unreceived(op, st)
                )
        if slow and self.coll is not None:  # stuck inside a collective: maybe because the ranks disagree
            ranks, key, seq, sig = self.coll
            mine = zlib.crc32(sig)
            for r in ranks:
                got = board.lookup_crc(r, key) if r != self.rank else None
                if got is not None and got[0] == seq and got[1] != mine:
                    self._disagree(r, key, sig)

    def _last_words(self, ops) -> None:
        """One more progress pass before blaming a peer that failed or left: what it sent last may be what we
        wait for, or a refusal of our message, which a peer that failed over it sent first and which is then the
        report (raised here)."""
        self.progress()
        if self.failed:
            self._raise_failed(ops)

    def _raise_if_mismatch(self) -> None:
        """A peer that failed over a disagreeing call marked the abort word before it marked itself failed.

        The word was read before the peer's state, so it is read again: the disagreement, not the exit, is the
        cause every rank should report.
        """
        fence()
        if self.board.q[0] and self.board.abort_is_mismatch():
            raise MismatchError(self.board.aborted())

    @staticmethod
    def _unreceived(op, state: int) -> str:
        return unreceived(op.peer, op.tag) if isinstance(op, SendOp) and state == shm.FINISHED else ""

    def _unclaimed(self, op) -> str:
        """For a receive that will never complete: the tags of what its peer did send that nobody took."""
        if not isinstance(op, RecvOp) or op.tag < 0:
            return ""
        tags = [s.hdr[0] for s in self.stash.get(op.peer, ()) if s.hdr[0] >= 0]
        ctrl = self.in_ctrl[op.peer]
        if self.tail[op.peer] < int(ctrl[C_HEAD]) and op.peer not in self.cur_in:  # a message nobody asked for
            hoff = self.in_slots[op.peer][self.tail[op.peer] % self.nslots][0]
            tag = HEADER.unpack_from(self.mv, hoff)[0]
            if tag >= 0:
                tags.append(tag)
        if not tags:
            return ""
        return (f" (rank {op.peer} sent rank {self.rank} a message with tag {', '.join(map(str, tags))}, "
                f"which no receive asked for: do the tags agree?)")

    def _report(self, ops, waited: float) -> str:
        return self._report_text(f"rank {self.rank} waited {waited:.1f} s in {self._what(ops)}", waited)

    def _peer_state(self, r: int) -> tuple[str, int, float, str]:
        """What rank ``r`` is doing: (kind, board state, since, description)."""
        st, since, desc = self.board.describe(r)
        if st == shm.WAITING:
            return "waiting", st, since, desc
        if process_state(self.peer_pid(r)) == "stopped":
            return "stopped", st, since, desc
        if st == shm.RUNNING:
            return "running", st, since, desc
        return shm.STATE_NAMES[st], st, since, desc

    def _states(self, settle: float = SETTLE_S) -> dict[int, str]:
        """Every rank's kind of activity (this one is waiting): the structured half of a timeout report.

        A rank seen running is looked at again for up to ``settle`` seconds: a rank that waits is running for a
        moment between two of its waits, and a report must not call it hung for that; a hung one stays running.
        """
        states = {r: "waiting" if r == self.rank else self._peer_state(r)[0] for r in range(self.world)}
        until = time.monotonic() + settle
        while "running" in states.values() and time.monotonic() < until:
            time.sleep(0.02)
            for r, kind in states.items():
                if kind == "running":
                    states[r] = self._peer_state(r)[0]
        return states

    def _report_text(self, first: str, waited: float) -> str:
        lines = [first]
        now = time.time()
        for r in range(self.world):
            if r == self.rank:
                continue
            kind, st, since, desc = self._peer_state(r)
            if kind == "waiting":
                lines.append(f"rank {r} is waiting ({now - since:.1f} s) in {desc}")
            elif kind == "stopped":
                lines.append(f"rank {r} is stopped (SIGSTOP, Ctrl-Z or a debugger): it cannot run until continued")
            elif kind == "running":
                lines.append(f"rank {r} is running its own code (not in a communication call)")
            else:
                lines.append(f"rank {r} has {shm.STATE_NAMES[st]}")
        return "; ".join(lines)

    def flush(self) -> None:
        """Finish every pending send and receive (a rank's function returned with work in flight)."""
        ops = [op for q in self.send_q.values() for op in q]
        ops += [op for q in self.recv_q.values() for op in q]
        ops += [op for op in self.cur_in.values() if not isinstance(op, _Stash)]
        if self.failed:
            self._raise_failed(list(self.failed))
        if ops:
            self.finishing = True
            self.wait(ops)

    def ring_all(self) -> None:
        for r, b in enumerate(self.bells):
            if r != self.rank:
                b.ring()
