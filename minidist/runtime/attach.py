"""Cross-memory attach from the Transport's side: which peers' memory this rank may read, and reading it.

A message above ``transport.RENDEZVOUS_BYTES`` travels as its header alone, with the address of the sender's
buffer; the receiver reads it straight from the sender's memory (``cma.py``, when the kernel allows it) and then
frees the slot, which completes the send. Each receiver probes each sender once: it reads a known word the sender
published on the board, and tells the sender the answer in the channel's ``C_CMA`` word.
"""

from __future__ import annotations

import numpy as np

from minidist.runtime import cma, shm
from minidist.runtime.errors import PeerExitedError, RankAborted
from minidist.runtime.shm import C_CMA


class Attach:
    """The Transport's cross-memory attach: the probe of each peer, and reads of its memory."""

    def _attach(self, rank: int, W: int, board: shm.Board) -> None:
        """Publish this rank's probe word and probe the peers that started before it (all of them, if cma is off,
        marked unreadable)."""
        self.cma_in = [0] * W  # per sender: 0 not probed yet, 1 we can read its memory, 2 we cannot
        self.scratch = None
        if cma.enabled():
            self._probe_word = np.array([cma.MAGIC], np.int64)
            w = board.rec[rank]
            board.q[w + shm.R_PROBE] = self._probe_word.__array_interface__["data"][0]
            self.scratch = np.empty((1 << 20) + cma.PAGE, np.uint8)
            for p in range(W):  # peers that started before us; the others when their first message arrives
                if p != rank:
                    self._probe(p)
        else:
            self.cma_in = [2] * W

    def peer_pid(self, r: int) -> int:
        return self.board.q[self.board.rec[r] + shm.R_PID]

    def _probe(self, src: int) -> None:
        """Find out once whether this rank may read ``src``'s memory, and tell ``src`` (C_CMA)."""
        pid = self.peer_pid(src)
        if not pid:
            return  # src has not started yet
        got = np.zeros(1, np.int64)
        err = cma.read(pid, self.board.q[self.board.rec[src] + shm.R_PROBE], got.__array_interface__["data"][0], 8)
        self.cma_in[src] = 1 if err is None and got[0] == cma.MAGIC else 2
        self.in_ctrl[src][C_CMA] = self.cma_in[src]

    def read_remote(self, src: int, pid: int, addr: int, into: np.ndarray, nbytes: int) -> None:
        err = cma.read(pid, addr, into.__array_interface__["data"][0], nbytes)
        if err is not None:
            msg = self.board.aborted()
            if msg is not None:
                raise RankAborted(f"rank {self.rank} stopped because {msg}")
            raise PeerExitedError(f"rank {self.rank} could not read the message of rank {src} from its memory "
                                  f"({nbytes} bytes): {err}")
