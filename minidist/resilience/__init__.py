"""Surviving failures (chapter 26, lab 17): sharded atomic checkpoints, injected faults, Young-Daly.

``md.parallel.train(..., resilience=md.parallel.Resilience(checkpoint_dir, every, faults=Faults(...),
restart=True))`` uses these; the checkpoint files and the failure arithmetic are usable on their own.
"""

from minidist.resilience.failures import (
    Faults,
    RankFailure,
    expected_completion,
    overhead,
    system_mtbf,
    young_daly_interval,
)
from minidist.resilience.store import CheckpointError, committed, latest, read, seal

__all__ = ["CheckpointError", "Faults", "RankFailure", "committed", "expected_completion", "latest", "overhead",
           "read", "seal", "system_mtbf", "young_daly_interval"]
