"""An investigation in five phases, run on a simulated run's trace (book ch33, lab 23).

Property: a slowdown has one place where the time went that the healthy run does not spend, so the procedure
narrows down instead of guessing: **triage** (is the step slower than predicted, and by how much), **localisation**
(which part of the step budget grew: compute, a collective on some axis, idle), **isolation** (which ranks or
links differ from their peers: robust z-scores, per-link bandwidth, stage imbalance, the count and size of
collectives), **root cause** (what the isolated difference means) and **resolution** (what to change). Each
phase uses only the profiling tools, so every conclusion can be checked against the numbers it came from.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from minidist.hardware.cluster import Cluster
from minidist.profiling.budget import run_budget
from minidist.profiling.links import link_bandwidths, link_efficiency, slow_links
from minidist.profiling.stragglers import compute_time_per_rank, robust_z, stragglers


@dataclass
class Report:
    """What each phase found: ``slowdown`` (vs the prediction), ``where`` (the budget's largest non-compute
    share), ``causes`` (kind, subject, evidence), ``fixes``; ``lines()`` prints it phase by phase."""

    step: float | None  # None: no step finished (the run hung or failed)
    slowdown: float | None = None
    shares: dict[str, float] = field(default_factory=dict)
    where: str = ""
    causes: list[tuple[str, object, str]] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)

    def kinds(self) -> list[str]:
        return [k for k, _, _ in self.causes]

    def lines(self) -> list[str]:
        if self.step is None:
            out = ["1 triage       : the run stopped without finishing a step", f"2 localisation : {self.where}"]
        else:
            out = [f"1 triage       : step {self.step * 1e6:.2f} us"
                   + (f", {self.slowdown:+.0%} against the prediction" if self.slowdown is not None else "")]
            top = sorted(self.shares.items(), key=lambda kv: -kv[1])[:4]
            out.append("2 localisation : " + ", ".join(f"{k} {v:.0%}" for k, v in top) + f" -> look at {self.where}")
        found = self.causes or [("nothing abnormal", None, "every rank and link like its peers")]
        for kind, subject, evidence in found:
            out.append(f"3 isolation    : {kind}" + (f" {subject}" if subject is not None else "") + f" ({evidence})")
        out.append("4 root cause   : " + ("; ".join(k for k in self.kinds()) if self.causes else "none found"))
        out += [f"5 resolution   : {f}" for f in self.fixes] or ["5 resolution   : none needed"]
        return out


FIXES = {
    "straggler": "replace or drain the slow GPU's node; until then, exclude it and rebalance the batch",
    "slow link": "reseat or replace the cable/port; route collectives around it (a different ring order)",
    "latency-bound communication": "larger gradient buckets: fewer, bigger collectives amortise each one's latency",
    "stage imbalance": "re-cut the pipeline stages by measured cost (pp_balance='measured', uneven layers)",
    "oversubscribed fabric": "keep the chattiest axes (tp, then cp/ep, then dp) inside nodes, reduce hierarchically "
                             "(inside nodes first), and ask for a placement under one leaf switch or a fabric "
                             "without oversubscription",
    "hung rank": "dump the hung rank's stack (py-spy dump, or the traceback the launcher prints), drain its node and "
                 "restart from the last checkpoint; keep a collective timeout so a hang becomes an error, as here",
    "stopped rank": "the rank's process is stopped (SIGSTOP, a debugger): continue it or restart without it",
    "ranks left early": "make every rank run the same collectives: one returned or failed while others waited",
}


def investigate(result, predicted_step: float | None = None, axis=None, step: int = -1,
                cluster: Cluster | None = None) -> Report:
    """Run the five phases on one step of an ``md.parallel.train`` result; ``predicted_step`` (e.g. from
    ``md.estimate.predict_train``) enables triage against a prediction, ``axis`` names collectives by mesh axis,
    ``cluster`` (default: the one ``train`` uses) gives each link's rated latency and bandwidth, to tell
    latency-bound traffic and a fabric slower than its rating.

    ``result`` may also be the error a run raised (``md.runtime.RankError``): a run that hangs has no step to
    profile, and the timeout report of its waiting ranks says who they wait for."""
    if isinstance(result, BaseException):
        return _investigate_failure(result)
    cluster = cluster or Cluster()
    budgets = run_budget(result, step, axis=axis)
    rep = Report(step=result.time[step])
    if predicted_step:
        rep.slowdown = rep.step / predicted_step - 1
    shares: dict[str, float] = defaultdict(float)
    for b in budgets:
        for k, v in b.parts.items():
            shares[k] += v / b.total / len(budgets)
    rep.shares = dict(shares)
    rest = {k: v for k, v in shares.items() if not k.startswith("compute:")}
    rep.where = max(rest, key=rest.get) if rest else "compute"

    compute = compute_time_per_rank(result, step)
    for r in stragglers(compute):
        rep.causes.append(("straggler", r, f"computes {compute[r] / np.median(compute):.2f}x the median rank"))
    lo, hi = result.windows[0][step]
    window = [e for e in result.trace.events if lo <= e.start < hi]
    from_trace = type(result.trace)(window)
    bw = link_bandwidths(from_trace)
    eff = link_efficiency(from_trace, cluster)
    inter = {k: v for k, v in eff.items() if not cluster.same_node(*k)}
    intra = [v for k, v in eff.items() if cluster.same_node(*k)]
    fabric = bool(inter) and max(inter.values()) < 0.7 and (not intra or min(intra) > 0.9)
    if fabric:  # slow alike everywhere between nodes: no outlier link, the fabric itself
        inside = f", the links inside nodes {np.median(intra):.2f}x" if intra else ""
        share = np.median(list(inter.values()))
        rep.causes.append(("oversubscribed fabric", "inter-node links",
                           f"every one of the {len(inter)} inter-node links delivers {share:.2f}x its rated "
                           f"bandwidth{inside}"))
    for link in slow_links(from_trace):
        if fabric and link in inter:
            continue
        rep.causes.append(("slow link", link, f"{bw[link] / np.median(list(bw.values())):.2f}x the median "
                                                "link's bandwidth"))
    if not rep.causes:
        spread = max(compute) / min(compute) - 1 if min(compute) > 0 else 0.0
        z = robust_z(compute)
        if spread > 0.15 and not np.any(np.abs(z) > 3.5):
            rep.causes.append(("stage imbalance", None, f"ranks' compute differs by {spread:.0%} in groups, "
                                                        "no single outlier"))
    if rep.where.startswith("exposed:") and shares[rep.where] > 0.3 and not rep.causes:
        name = rep.where.split(":", 1)[1].split("@")[0]
        calls = [e for e in window if e.rank == 0 and e.stream == "comm" and e.name == name]
        msgs = [e for e in window if e.rank == 0 and e.stream == "link"]
        busy = sum(e.end - e.start for e in msgs)
        latency = sum(cluster.link(0, int(e.name.split("->")[1])).alpha for e in msgs)
        if len(calls) >= 8 and busy > 0 and latency / busy > 0.5:
            size = np.mean([e.nbytes for e in calls])
            rep.causes.append(("latency-bound communication", name,
                               f"{len(calls)} calls of {size:,.0f} bytes in one step, {latency / busy:.0%} of "
                               "the link time is latency"))
    rep.fixes = [FIXES[k] for k in dict.fromkeys(rep.kinds())]
    return rep


def _investigate_failure(error: BaseException) -> Report:
    """The five phases for a run that stopped: the first timeout report names what every rank was doing; a rank
    running its own code while the others wait for it is hung (or stopped, if its process is)."""
    exc = getattr(error, "exc", None) or error
    states = getattr(exc, "states", None)
    rep = Report(step=None)
    if not states:
        rep.where = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        rep.causes.append(("failure", getattr(error, "rank", None), "not a hang: read the error and its traceback"))
        rep.fixes = ["fix the error the traceback names, then restart from the last checkpoint"]
        return rep
    # a rank that failed meanwhile most likely timed out in its own wait, a moment after this one
    waiting = sorted(r for r, s in states.items() if s in ("waiting", "failed"))
    rep.where = f"ranks {waiting} wait in communication calls until the timeout ({type(exc).__name__})"
    for kind, label in (("running", "hung rank"), ("stopped", "stopped rank")):
        for r in sorted(r for r, s in states.items() if s == kind):
            rep.causes.append((label, r, f"{kind} {'its own code' if kind == 'running' else ''}".rstrip()
                               + f" while {len(waiting)} ranks wait"))
    if not rep.causes:
        gone = sorted(r for r, s in states.items() if s in ("finished", "failed"))
        rep.causes.append(("ranks left early", gone, "a peer finished or failed while others still wait for it"))
    rep.fixes = [FIXES[k] for k in dict.fromkeys(rep.kinds())]
    return rep
