"""A collective call's agreement: each rank publishes its call on the board, and waits until its group's members
have published the same one.

Messages carry the call's signature too, so no data is ever taken from a disagreeing call; the agreement catches
the calls whose data never meets (a rank that skipped the call, or called another with the same messages).
"""

from __future__ import annotations

import time
import zlib

from minidist.runtime import deadlock, shm
from minidist.runtime.channels import fence
from minidist.runtime.errors import CommTimeoutError, MismatchError, PeerExitedError, RankAborted


class Agreement:
    """The Transport's side of the board's collective records: ``publish`` and ``agree``."""

    def _disagree(self, r: int, key: int, sig: bytes):
        got = self.board.lookup(r, key)
        theirs = got[2] if got is not None else "a different call"
        raise MismatchError(f"ranks disagree about a collective call: rank {r} called {theirs}; "
                            f"rank {self.rank} called {sig.decode(errors='replace')}")

    def publish(self, ranks, key: int, seq: int, sig: bytes, wake: bool = True) -> None:
        """Announce this rank's collective call on the board (checked by peers that wait on us).

        Peers sleep on the board only in ``agree``, waiting for this very call; a call that never agrees
        (its data reaches everyone) passes ``wake=False``: a peer asleep there made another call, and
        its own timed nap finds the disagreement. That saves a fence and a look at every member.
        """
        board = self.board
        board.publish(self.rank, key, seq, sig)
        self.coll = (ranks, key, seq, sig)
        if not wake:
            return
        fence()
        q, rec, me = board.q, board.rec, self.rank
        for r in ranks:  # wake only the peers sleeping in agree(), waiting for this
            if q[rec[r] + shm.R_NAP] and r != me:
                self.bells[r].ring()

    def agree(self, ranks, key: int, seq: int, sig: bytes, what: str) -> None:
        """Wait until every member has published the same call (after the data moved, so usually at once).

        No simulated time passes. Ranks that disagree all raise, each naming the other's call: a
        member that is already past this call has checked ours, so it agreed. Messages carry the
        signature too, so no data is ever taken from a disagreeing call.
        """
        me = self.rank
        board = self.board
        mine = zlib.crc32(sig)
        todo = [r for r in ranks if r != me]
        t0 = time.monotonic()
        blocked, suspect = False, None
        try:
            while True:
                late = []
                for r in todo:
                    got = board.lookup_crc(r, key)
                    if got is None or got[0] < seq:
                        late.append(r)
                    elif got[0] == seq and got[1] != mine:
                        self._disagree(r, key, sig)
                if not late:
                    return
                todo = late
                msg = board.aborted()
                if msg is not None:
                    if board.abort_is_mismatch():
                        raise MismatchError(msg)
                    raise RankAborted(f"rank {me} stopped because {msg}")
                for r in late:
                    st = board.state(r)
                    got = board.lookup_crc(r, key)
                    if st in (shm.FINISHED, shm.FAILED) and (got is None or got[0] < seq):
                        self._raise_if_mismatch()
                        raise PeerExitedError(f"rank {me} waits for rank {r} to join {what} but rank {r} has "
                                              f"{shm.STATE_NAMES[st]}")
                now = time.monotonic()
                if now - t0 >= self.timeout:
                    raise CommTimeoutError(self._report_text(
                        f"rank {me} waited {now - t0:.1f} s for ranks {late} to join {what}", now - t0),
                        self._states())
                if not blocked:
                    if self.spin and now - t0 < self.spin:
                        if self.pause is not None:
                            self.pause()
                        continue
                    blocked = True
                    board.set_state(me, shm.WAITING, time.time(),
                                    f"{sig.decode(errors='replace')}: waiting for ranks {late} to join")
                    deadlock.publish_waits(board, me, late)
                    board.set_napping(me, True)
                    fence()
                    continue  # look once more now that peers can see we sleep: no lost wake-up
                if now - t0 > 0.5:
                    suspect = self._check_deadlock(suspect, now)
                self._sleep(min(self.timeout - (now - t0), 0.25))
        finally:
            if blocked:
                board.set_napping(me, False)
                board.set_state(me, shm.RUNNING)
