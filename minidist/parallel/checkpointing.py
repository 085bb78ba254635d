"""Checkpoints and injected failures inside the rank loop of ``md.parallel.train`` (chapter 26, lab 17).

At a step boundary, after the optimizer step, every rank captures its share of the state
(``rank_state.capture``), copies it out of the step (the only part that blocks, charged at the speed
of the link to host memory), and writes its own file; a barrier and rank 0's manifest publish the
checkpoint (``resilience.store``). Asynchronous checkpoints write in a background thread and are
published at the next checkpoint or at the end of the run, so the step never waits for storage unless
the next checkpoint arrives before the last one is written. Writing is charged to the simulated clock
at the cluster's storage bandwidth, shared by the ranks of a node.

A rank that is to fail (``resilience.Faults``) writes down when, then exits: the runtime stops the
others, and the trainer restarts from the newest intact checkpoint.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minidist import dist
from minidist.parallel.rank_state import MOMENTS, capture, capture_loop, merge, merge_loop, restore, restore_loop
from minidist.resilience.failures import Faults
from minidist.resilience.store import AsyncWriter, commit, committed, read, write_rank


@dataclass(frozen=True)
class CheckpointPlan:
    """Where and how often to checkpoint: every ``every`` steps into ``root`` (asynchronously if ``async_``),
    keeping the ``keep`` newest; ``every=None`` only reads (a run that resumes and writes nothing)."""

    root: str
    every: int | None
    async_: bool = False
    keep: int = 2


def failure_path(record_dir: str, attempt: int) -> Path:
    return Path(record_dir) / f"failure_{attempt}.json"


class RankCheckpointer:
    """One rank's checkpoints and faults during one attempt of a run."""

    def __init__(self, plan: CheckpointPlan | None, faults: Faults | None, record_dir: str, attempt: int,
                 kills: list, par, optimizer, mesh, clock, cluster, scaler=None) -> None:
        self.plan, self.faults, self.record_dir, self.attempt = plan, faults, record_dir, attempt
        self.scaler = scaler  # the dynamic loss scaler (or None): its state is saved and rolled back too
        self.par, self.opt, self.mesh, self.clock, self.cluster = par, optimizer, mesh, clock, cluster
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.kills = {step for r, step in kills if r == self.rank}
        arrival = faults.arrivals(attempt, self.world) if faults is not None else None
        self.fail_at = arrival[0] if arrival is not None and arrival[1] == self.rank else None
        if faults is not None:
            clock.slowdown = float(faults.slow.get(self.rank, 1.0))
        self.spike = float(faults.spike.get(self.rank, 0.0)) if faults is not None else 0.0
        self.in_place = faults is not None and faults.in_place
        if self.in_place and (plan is None or plan.every is None):
            raise ValueError("parallel.train: Faults(in_place=True) rolls back to checkpoints: give checkpoint_dir "
                             "and checkpoint_every")
        self.arrivals = faults.in_place_arrivals() if self.in_place else None
        self.next_fail = next(self.arrivals) if self.in_place else None
        self.failures: list[dict] = []
        self.lost = 0.0
        self.writer = AsyncWriter() if plan is not None and plan.async_ else None
        self.pending: tuple | None = None  # (step, shared state, simulated time the background write ends)
        self.last_commit = 0.0
        self.blocked = 0.0  # simulated seconds the steps waited for checkpoints

    # -- faults --------------------------------------------------------------------------------
    def before_step(self, step: int) -> None:
        if step in self.kills:
            self._die(step, self.clock.now(), "killed")
        if self.spike:  # held from before the step starts to after it ends: the step's peak carries it
            dist.memory().alloc("buffers", self.spike)
        if self.faults is not None and self.faults.hang.get(self.rank) == step:
            while True:  # a hang: no error, no progress; only the peers' timeout can end the run
                time.sleep(0.05)

    def after_step(self, step: int) -> bool:
        """Fail here if the fault plan says so; True means "roll back" (an in-place failure)."""
        if self.spike:
            dist.memory().free("buffers", self.spike)
        if self.fail_at is not None and self.clock.now() >= self.fail_at:
            self._die(step, self.fail_at, "MTBF failure")
        if not self.in_place:
            return False
        now = np.array([self.clock.now()])
        if self.world > 1:  # every rank must take the same decision: the latest clock decides (a heartbeat)
            dist.all_reduce(now, op=dist.ReduceOp.MAX)
        return bool(now[0] >= self.next_fail)

    def _struck(self) -> bool:
        """Has the next in-place failure arrived? The same answer on every rank: the latest clock decides."""
        now = np.array([self.clock.now()])
        if self.world > 1:
            dist.all_reduce(now, op=dist.ReduceOp.MAX)
        return bool(now[0] >= self.next_fail)

    def start(self, step: int, shared: dict, extra: dict) -> None:
        """In-place failures roll back to a checkpoint: there is always one, from the first step on."""
        if self.in_place and step not in committed(self.plan.root):
            self.save(step, shared, extra, may_fail=False)  # the run's first checkpoint: its starting point

    def rollback(self, par, optimizer, rng) -> int:
        """An in-place failure at ``next_fail``: the work since the last published checkpoint is lost; every
        rank reloads it (the pending asynchronous one, unpublished, is lost too). Returns its step."""
        failed_at = self.next_fail
        if self.writer is not None:
            self.writer.wait()
            self.pending = None
        self.failures.append({"rank": None, "step": None, "clock": failed_at, "reason": "MTBF failure (in place)"})
        self.lost += self.clock.now() - self.last_commit
        manifest, ranks = read(self.plan.root, committed(self.plan.root)[-1])
        tp = self.mesh.get_local_rank("tp"), self.mesh.size("tp")
        restore(par.reducer, optimizer, par.model, merge(ranks), par.tp_axes, *tp)
        restore_loop(par.model, self.scaler, merge_loop([meta for _, meta in ranks]))
        rng.bit_generator.state = manifest["rng"]
        kinds = 1 + len(MOMENTS[optimizer.kind])
        sharing = min(self.world, self.cluster.gpus_per_node)
        read_s = kinds * sum(p.nbytes for p, _ in par.reducer.pieces()) * sharing / self.cluster.storage_bw
        self.clock.charge_compute_seconds("restart", self.faults.restart_seconds + read_s)
        self.next_fail = next(self.arrivals)  # failures keep coming on the job's clock, whatever it redoes
        self.last_commit = self.clock.now()
        return int(manifest["step"])

    def _die(self, step: int, when: float, reason: str) -> None:
        record = {"rank": self.rank, "step": step, "clock": when, "reason": reason, "attempt": self.attempt,
                  "last_commit": self.last_commit}
        path = failure_path(self.record_dir, self.attempt)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
        os._exit(17)  # a real failure: no goodbye to the other ranks, the runtime has to notice

    # -- checkpoints ---------------------------------------------------------------------------
    def due(self, step_done: int) -> bool:
        return self.plan is not None and self.plan.every is not None and step_done % self.plan.every == 0

    def save(self, step_done: int, shared: dict, extra: dict, may_fail: bool = True) -> None:
        """Checkpoint the state after ``step_done`` steps; ``shared`` is what rank 0 puts in the manifest,
        ``extra`` what this rank adds to its own file's description (its losses and step windows). An in-place
        failure that strikes during a blocking write leaves that checkpoint unpublished (``may_fail``)."""
        start = self.clock.now()
        self._publish_pending()
        tp = self.mesh.get_local_rank("tp"), self.mesh.size("tp")
        arrays, meta = capture(self.par.reducer, self.opt, self.par.model, self.par.tp_axes, *tp)
        meta.update(extra, **capture_loop(self.par.model, self.scaler, self.par.reducer))
        nbytes = sum(a.nbytes for a in arrays.values())
        self.clock.charge_compute_seconds("checkpoint.copy", nbytes / self.cluster.host_link.beta)
        sharing = min(self.world, self.cluster.gpus_per_node)  # the node's ranks share its storage bandwidth
        write = nbytes * sharing / self.cluster.storage_bw
        args = (self.plan.root, step_done, self.rank, arrays, meta)
        if self.writer is None:
            write_rank(*args)
            self.clock.charge_compute_seconds("checkpoint.write", write)
            if may_fail and self.in_place and self._struck():
                # the machine failed before the checkpoint was whole: it is never published, and the end of the
                # next step notices the failure and rolls back to the checkpoint before (a write is work at risk)
                self.blocked += self.clock.now() - start
                return
            self._publish(step_done, shared)
        else:
            self.writer.start(*args)
            self.pending = (step_done, shared, self.clock.now() + write)
        self.blocked += self.clock.now() - start

    def finish(self) -> None:
        """At the end of the run: publish the last asynchronous checkpoint."""
        start = self.clock.now()
        self._publish_pending()
        self.blocked += self.clock.now() - start

    def _publish_pending(self) -> None:
        if self.pending is None:
            return
        step, shared, done = self.pending
        self.pending = None
        self.writer.wait()
        if done > self.clock.now():
            self.clock.charge_compute_seconds("checkpoint.wait", done - self.clock.now())
        self._publish(step, shared)

    def _publish(self, step: int, shared: dict) -> None:
        dist.barrier()  # every rank's file is on disk
        self.last_commit = self.clock.now()
        if self.rank == 0:
            commit(self.plan.root, step, self.world, {**shared, "attempt": self.attempt,
                                                      "clock": self.last_commit}, self.plan.keep)
        dist.barrier()  # nobody fails "after" a checkpoint that is not published yet


class NoCheckpoints:
    """The keeper of a run without checkpoints or faults: it does nothing."""

    blocked = 0.0

    def before_step(self, step: int) -> None:
        pass

    def after_step(self, step: int) -> bool:
        return False

    def start(self, step: int, shared: dict, extra: dict) -> None:
        pass

    def due(self, step_done: int) -> bool:
        return False

    def finish(self) -> None:
        pass


@dataclass
class Attempt:
    """One launch of a resilient run: its checkpoint plan, its faults, and the state it resumes from
    (``resume``: ``{"step", "full", "rng", "losses", "times", "loop"}``, the merged state of a checkpoint)."""

    plan: CheckpointPlan | None = None
    faults: Faults | None = None
    record_dir: str = ""
    index: int = 0
    kills: tuple = ()
    resume_from: dict | None = None

    def checkpointer(self, par, optimizer, mesh, clock, scaler=None):
        if self.plan is None and self.faults is None:
            return NoCheckpoints()
        return RankCheckpointer(self.plan, self.faults, self.record_dir, self.index, list(self.kills), par, optimizer,
                                mesh, clock, clock.cluster, scaler)

    def resume(self, par, optimizer, mesh, rng: np.random.Generator, clock, scaler=None) -> int:
        """Put the checkpoint's state into this rank's layout (weights, moments, routing biases, loss scaler);
        return the step to continue from (0: none)."""
        r = self.resume_from
        if r is None:
            return 0
        tp = mesh.get_local_rank("tp"), mesh.size("tp")
        restore(par.reducer, optimizer, par.model, r["full"], par.tp_axes, *tp)
        restore_loop(par.model, scaler, r.get("loop"))
        rng.bit_generator.state = r["rng"]
        kinds = 1 + len(MOMENTS[optimizer.kind])  # weights and each moment, the same size
        mine = kinds * sum(p.nbytes for p, _ in par.reducer.pieces())
        sharing = min(dist.get_world_size(), clock.cluster.gpus_per_node)
        clock.charge_compute_seconds("checkpoint.read", mine * sharing / clock.cluster.storage_bw)
        return int(r["step"])

    def shared(self, rng: np.random.Generator, pc) -> dict:
        """What every rank agrees on and rank 0 writes into the manifest."""
        r = self.resume_from or {}
        return {"rng": rng.bit_generator.state, "layout": repr(pc), "losses": r.get("losses", []),
                "times": r.get("times", [])}
