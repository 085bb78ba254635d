"""Restarting a failed training run from its newest intact checkpoint (chapter 26, lab 17).

``md.parallel.train`` runs a resilient run as a sequence of attempts, each one ``md.launch``. When a
rank fails, the runtime stops the others and the attempt ends with an error; the failed rank has left a
note of when it failed (on its simulated clock) and what it had committed. The next attempt resumes from
the newest checkpoint that reads back intact - possibly written by an earlier attempt, or under another
layout - and the run's account grows by the attempt's time, the restart's cost and the work lost since
the last checkpoint. The losses and step times of the steps before the checkpoint come from the
checkpoint itself, so the final result covers the whole run.

A rank process that really dies (``os._exit``, SIGKILL, the OOM killer) fails its attempt too, and restarts
like an injected failure; it leaves no note, so the account counts that attempt up to its last checkpoint and
no lost work (its clock died with it). A rank whose code raises is an error, raised, not restarted.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import tempfile
import warnings

from minidist.parallel.checkpointing import Attempt, CheckpointPlan, failure_path
from minidist.parallel.rank_state import merge, merge_loop
from minidist.resilience.failures import Faults, RankFailure
from minidist.resilience.store import CheckpointError, discard_partial, latest, set_aside
from minidist.runtime import RankError


def step_loss(parts) -> float:
    """A step's loss from the lead ranks' shares, the same whether they come from the ranks or a checkpoint.

    The correctly rounded sum: Python's ``sum`` adds floats read back from a checkpoint with compensation
    (3.12 and later) but numpy's float64s from the ranks one by one, so a restarted run's losses could differ
    from the uninterrupted run's in the last bit."""
    return math.fsum(float(v) for v in parts)


def died(error: RankError) -> bool:
    """Did the launch fail because a rank's process ended without a report (``os._exit``, a signal such as SIGKILL,
    the OOM killer), rather than because a rank's code raised?"""
    return bool(error.errors) and error.errors.get(error.rank, ("",))[0] == "RankDied"


def after_setup(windows: list[list], synced=()) -> list[list]:
    """Every rank's step windows (``[(start, end)]`` per step), the first begun when the last rank finished its
    setup (the broadcast of the initial weights, a checkpoint's read) rather than at the rank's own start, and so
    each step of ``synced`` (the indices of the steps right after a checkpoint) when the last rank finished that
    checkpoint.

    The setup and a checkpoint leave the ranks' clocks apart (the checkpoint's publish barrier is root-based: it
    releases the ranks one after another; ranks copy out shares of different sizes), and the time an early rank then
    waits for the latest in the next step's collectives is the setup's or the checkpoint's, not the step's: so those
    steps are timed like the others."""
    if not windows or not windows[0]:
        return windows
    out = [list(w) for w in windows]
    for s in sorted({0, *synced}):
        if s < len(out[0]):
            begin = max(w[s][0] for w in out)
            for w in out:
                w[s] = (min(begin, w[s][1]), w[s][1])
    return out


def step_times(windows: list[list], n: int, synced=()) -> list[float]:
    """The simulated seconds of an attempt's first ``n`` steps from every rank's step windows: the slowest rank's,
    the first step from the end of the setup and a step after a checkpoint from its end (:func:`after_setup`)."""
    windows = after_setup(windows, synced)
    return [max(w[s][1] - w[s][0] for w in windows) for s in range(n)]


class Attempts:
    """The attempts of one run, and the account of what failures cost."""

    def __init__(self, plan: CheckpointPlan | None, faults: Faults | None, restart: bool, max_restarts: int,
                 resume: bool | str, steps: int | None = None) -> None:
        self.plan, self.faults, self.restart, self.resume = plan, faults, restart, resume
        self.max_restarts, self.steps = max_restarts, steps
        self.losses: list[float] = []  # of the steps before the state resumed from
        self.times: list[float] = []
        self.failures: list[dict] = []
        self.elapsed = 0.0  # simulated seconds spent before the last attempt began
        self.lost = 0.0

    def run(self, launch_attempt):
        """``launch_attempt(attempt)`` until one finishes; return its launch result."""
        # Named first and made inside the try, so that an interrupt cannot land between making it and the finally.
        record_dir = os.path.join(tempfile.gettempdir(), f"minidist_failures_{secrets.token_hex(6)}")
        try:
            os.mkdir(record_dir, 0o700)
            kills = list(self.faults.kill) if self.faults is not None else []
            state = self._load() if self.resume else None
            if state is not None and self.steps is not None and state["step"] >= self.steps:
                raise ValueError(f"parallel.train: the newest intact checkpoint in {self.plan.root} is of step "
                                 f"{state['step']}, at or past steps={self.steps}: nothing is left to train; pass "
                                 f"steps > {state['step']} to continue it, or another checkpoint_dir to start anew")
            for index in range(self.max_restarts + 1):
                try:
                    return launch_attempt(Attempt(self.plan, self.faults, record_dir, index, tuple(kills), state))
                except RankError as e:
                    path = failure_path(record_dir, index)
                    if path.exists():
                        rec = json.loads(path.read_text())
                    elif self.restart and died(e):  # a rank process really died: no note of when it did
                        rec = {"rank": e.rank, "step": None, "clock": None, "reason": e.errors[e.rank][1],
                               "attempt": index, "last_commit": 0.0}
                    else:
                        raise  # an exception in a rank's code: an error, not a failure to restart from
                    self.failures.append(rec)
                    if not self.restart:
                        raise RankFailure(f"parallel.train: rank {rec['rank']} failed at step {rec['step']} "
                                          f"({rec['reason']}); pass restart=True (with checkpoint_dir and "
                                          f"checkpoint_every) to restart from the last checkpoint") from e
                    if [rec["rank"], rec["step"]] in [list(k) for k in kills]:
                        kills = [k for k in kills if list(k) != [rec["rank"], rec["step"]]]  # each kill fires once
                    state = self._load()
                    same = state is not None and state["attempt"] == index
                    if rec["clock"] is None:  # the dead rank's clock died with it: counted to its last checkpoint
                        rec["clock"] = rec["last_commit"] = state["clock"] if same else 0.0
                    self.lost += rec["clock"] - (rec["last_commit"] if same else 0.0)
                    self.elapsed += rec["clock"] + (self.faults.restart_seconds if self.faults is not None else 0.0)
            raise RankFailure(f"parallel.train: the run failed {self.max_restarts + 1} times; giving up "
                              f"(raise max_restarts, or checkpoint more often)")
        finally:
            shutil.rmtree(record_dir, ignore_errors=True)
            if self.plan is not None and self.plan.every is not None:
                discard_partial(self.plan.root)  # a failed write's files: no rank is writing any more

    def _load(self) -> dict | None:
        """The newest intact checkpoint as whole tensors, or None when there is none (then the run starts over).

        Checkpoints that are all unusable raise CheckpointError, unless ``resume="or-start-over"``: then they are
        set aside (renamed ``*.unusable``) with a warning, and the run starts over."""
        found = None
        if self.plan is not None:
            try:
                found = latest(self.plan.root, warn=lambda m: warnings.warn(m, stacklevel=2))
            except CheckpointError as e:
                if self.resume != "or-start-over":
                    raise CheckpointError(f"parallel.train: {e}. Pass resume='or-start-over' to start from step 0 "
                                          f"instead (the unusable checkpoints are renamed *.unusable)") from None
                moved = set_aside(self.plan.root)
                warnings.warn(f"parallel.train: {e}; starting over from step 0 (resume='or-start-over'), the unusable "
                              f"checkpoints are set aside as {', '.join(p.name for p in moved)}", stacklevel=3)
        if found is None:
            self.losses, self.times = [], []
            return None
        manifest, ranks = found
        metas = [meta for _, meta in ranks]
        n = len(metas[0]["losses"])  # the steps the writing attempt ran before this checkpoint
        lead = [m for m in metas if m["lead"]]
        self.losses = manifest["losses"] + [step_loss(m["losses"][s] for m in lead) for s in range(n)]
        self.times = manifest["times"] + step_times([m["windows"] for m in metas], n, metas[0].get("synced", ()))
        return {"step": manifest["step"], "full": merge(ranks), "rng": manifest["rng"], "losses": self.losses,
                "times": self.times, "attempt": manifest["attempt"], "clock": manifest.get("clock", 0.0),
                "loop": merge_loop(metas)}
