"""Errors the runtime raises instead of hanging: each one says which ranks and which call."""

from __future__ import annotations


class MismatchError(ValueError):
    """Ranks disagree about a message or a collective (size, dtype, shape, op, root, algorithm)."""


class CommTimeoutError(TimeoutError):
    """A rank waited longer than the launch timeout; the message reports who waits for whom."""


class PeerExitedError(RuntimeError):
    """A rank waits for a peer that has already finished (or failed) and will never answer."""


class RankAborted(RuntimeError):
    """Another rank failed, so this rank stops at its next communication call."""


class RankError(RuntimeError):
    """Raised by ``launch`` in the parent: one or more ranks failed.

    ``errors`` maps rank -> (exception type name, message, traceback text); ``rank`` is the rank that
    failed first and ``exc`` its exception object when it could be carried back.
    """

    def __init__(self, message: str, rank: int | None = None, errors: dict | None = None, exc=None) -> None:
        super().__init__(message)
        self.rank = rank
        self.errors = errors or {}
        self.exc = exc
