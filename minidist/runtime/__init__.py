"""Runtime: rank processes, the shared-memory transport, process groups and device meshes.

``launch`` starts the ranks (chapter 0 of the labs: the sandbox); ``minidist.dist`` is the API a
rank uses; ``transport`` moves the bytes; the simulated clocks and ledgers live in
``minidist.hardware``.
"""

from minidist.runtime.errors import (
    CommTimeoutError,
    DeadlockError,
    MismatchError,
    PeerExitedError,
    RankAborted,
    RankError,
)
from minidist.runtime.groups import ProcessGroup
from minidist.runtime.launch import launch
from minidist.runtime.ops import ReduceOp
from minidist.runtime.results import LaunchResult
from minidist.runtime.work import Work

__all__ = [
    "CommTimeoutError", "DeadlockError", "LaunchResult", "MismatchError", "PeerExitedError", "ProcessGroup",
    "RankAborted", "RankError", "ReduceOp", "Work", "launch",
]
