"""Errors the runtime raises instead of hanging: each one says which ranks and which call."""

from __future__ import annotations

import os
import signal

import numpy as np


def misfit(name: str, src: int, dst: int, tag: int, sent: tuple, into: tuple) -> str:
    """The text, alike in every backend, for a message that does not fit its receive.

    ``sent`` and ``into`` are (shape, dtype, nbytes). A collective's own messages carry internal (negative)
    tags, so those are not shown; an all-to-all's say which sizes the two ranks disagree about."""
    def fmt(shape, dtype, nbytes) -> str:
        return f"shape {tuple(shape)} dtype {np.dtype(dtype).name} ({nbytes} bytes)"

    text = (f"{name}: message from rank {src} to rank {dst}{f' (tag {tag})' if tag >= 0 else ''} does not fit: "
            f"rank {src} sent {fmt(*sent)} but rank {dst} receives into {fmt(*into)}")
    if name == "all_to_all_single":
        text += (f"; rank {src}'s input_split_sizes entry for rank {dst} must equal rank {dst}'s output_split_sizes "
                 f"entry for rank {src}")
    elif name == "all_gather":
        text += f"; rank {dst}'s tensor_list[{src}] must have as many elements as rank {src}'s tensor"
    elif name == "all_to_all":
        text += (f"; rank {src}'s input_tensor_list entry for rank {dst} must have as many elements as rank {dst}'s "
                 f"output_tensor_list entry for rank {src}")
    return text


class MismatchError(ValueError):
    """Ranks disagree about a message or a collective (size, dtype, shape, op, root, algorithm)."""


class CommTimeoutError(TimeoutError):
    """A rank waited longer than the launch timeout; the message reports who waits for whom.

    ``states`` maps every rank to what it was doing when the wait gave up: ``"waiting"`` (in a
    communication call), ``"running"`` (its own code), ``"stopped"`` (SIGSTOP), ``"finished"`` or ``"failed"``;
    a rank that is running while the others wait for it is the one that hangs.
    """

    def __init__(self, message: str, states: dict | None = None) -> None:
        super().__init__(message)
        self.states = dict(states or {})


class PeerExitedError(RuntimeError):
    """A rank waits for a peer that has already finished (or failed) and will never answer."""


class DeadlockError(RuntimeError):
    """Ranks wait for each other in a cycle: none of them can ever proceed (see deadlock.py)."""


class RankAborted(RuntimeError):
    """Another rank failed, so this rank stops at its next communication call."""


def reason(e: BaseException) -> str:
    """What a rank's exception says; for ``sys.exit`` (whose text is only its code), what exiting means in a rank."""
    if isinstance(e, SystemExit):
        return (f"sys.exit({e.code!r}) was called in fn; a rank ends by returning from fn (what it returns is its "
                f"result), so the launch stops here")
    return str(e)


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


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/``pid``/stat after the command name (state, ppid, ...), or None if unreadable.

    The name is cut at the last ")" because a process may put anything in it, spaces and ")" included."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_state(pid: int) -> str | None:
    """What the kernel says of process ``pid`` (Linux): "stopped", "gone", "running", or None if unknown.

    A rank stopped by SIGSTOP (Ctrl-Z, a debugger) looks, from the board, like a rank busy in its own
    code; reports ask the kernel to tell the two apart.
    """
    if not pid:
        return None
    fields = proc_stat(pid)
    if not fields:
        return "gone" if os.path.isdir("/proc") else None
    state = fields[0]
    return {"T": "stopped", "t": "stopped", "Z": "gone", "X": "gone"}.get(state, "running")


# What usually sends a rank each signal, for a report that would otherwise say only "exit code -9"
_SIGNAL_CAUSES = {
    "SIGSEGV": "a segmentation fault: native code (numpy, a C extension, ctypes) touched memory it does not own",
    "SIGBUS": "a bus error: often shared memory (/dev/shm) full, as in a container's 64 MB default",
    "SIGKILL": "killed from outside: often the kernel's out-of-memory killer (see dmesg), or kill -9",
    "SIGABRT": "native code aborted (a failed assertion in a C library)",
    "SIGFPE": "an arithmetic fault in native code",
    "SIGILL": "an illegal instruction: a library built for a newer CPU than this one",
    "SIGTERM": "terminated from outside (kill)",
}


def exit_text(code: int | None, cause: bool = True) -> str:
    """A rank process's end as people read it: ``exit code 1``, or the signal that killed it (and its usual cause)."""
    if code is None:
        return "exit code unknown"
    if code >= 0:
        return f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"killed by signal {-code}"
    why = _SIGNAL_CAUSES.get(name) if cause else None
    return f"killed by {name}" + (f", {why}" if why else "")
