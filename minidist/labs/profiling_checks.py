"""Checks for lab 23, profiling and investigation (book chapters 32-33): the robust z-score, bus bandwidth, the
overlap of two streams from their spans, and a diagnosis of fresh mystery runs, against ``md.profiling``."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from minidist.labs.check import CheckFailed, attempt, busy_and_both, check_cases, fail, number, passed
from minidist.profiling import bus_factor, robust_z


def check_overlap_fraction(fn: Callable[[float, float, float], float]) -> None:
    """``fn(t_compute, t_comm, t_step)``: alpha_ov from T = T_c + T_m - alpha_ov min(T_c, T_m)."""
    cases = [((c, m, t), (c + m - t) / min(c, m), "solve T = T_c + T_m - alpha min(T_c, T_m) for alpha")
             for c, m, t in ((10.0, 4.0, 14.0), (3.0, 8.0, 9.5), (10.0, 4.0, 10.0), (10.0, 4.0, 12.0))]

    def diagnose(args, expected, got):
        c, m, t = args
        if math.isclose(got, (c + m - t) / max(c, m)):
            return "divide by the shorter stream: at most all of it can hide under the longer one"
        if math.isclose(got, (c + m - t) / t):
            return "alpha is a share of the shorter stream's time, not of the step"
        return None

    check_cases("overlap_fraction", fn, cases, rel=1e-12, diagnose=diagnose)


def check_bus_bandwidth(fn: Callable[[float, str, int], float]) -> None:
    """``fn(algbw, collective, p)``: nccl-tests' bus bandwidth."""
    cases = [((1e9, op, p), 1e9 * bus_factor(op, p), "busbw = algbw x (what each rank must move) / (buffer)")
             for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast") for p in (2, 8)]

    def diagnose(args, expected, got):
        algbw, op, p = args
        if op == "all_reduce" and math.isclose(got, algbw * (p - 1) / p):
            return "an all-reduce is a reduce-scatter then an all-gather: 2 (p-1)/p"
        if op in ("all_gather", "reduce_scatter") and math.isclose(got, algbw * 2 * (p - 1) / p):
            return "an all-gather alone moves (p-1)/p of the buffer through each rank"
        return None

    check_cases("bus_bandwidth", fn, cases, rel=1e-12, diagnose=diagnose)


def check_robust_z(fn: Callable[[np.ndarray], np.ndarray]) -> None:
    """``fn(values)``: (x - median) / (1.4826 MAD), the MAD kept above a tiny floor."""
    rng = np.random.default_rng(0)
    samples = [np.r_[np.full(7, 1.0) + rng.normal(0, 0.01, 7), 1.5], rng.normal(5, 2, 20), np.array([3.0, 1, 2, 8])]
    for x in samples:
        got = _call_robust_z(fn, x)
        want = robust_z(x)
        # rtol 1e-4: 0.6745 (x - median) / MAD, Iglewicz and Hoaglin's form of the same score, is as good
        if got.shape != x.shape or not np.allclose(got, want, rtol=1e-4):
            plain = (x - x.mean()) / x.std()
            if got.shape != x.shape:
                hint = f"return one score per value: an array of shape {x.shape}, not {got.shape}"
            elif np.allclose(got, plain):
                hint = ("that is the plain z-score: the outlier drags the mean and the standard deviation; use the "
                        "median and the median absolute deviation")
            elif np.allclose(np.abs(got), np.abs(want), rtol=1e-4):
                hint = "keep the sign: a value below the median has a negative score (no abs of x - median)"
            else:
                hint = "scale the MAD so that it estimates a standard deviation (see the text)"
            fail(f"robust_z({np.round(x, 3).tolist()})", np.round(want, 3).tolist(), np.round(got, 3).tolist(), hint)
    same = np.array([2.0, 2.0, 2.0, 5.0])  # most ranks identical, as in a simulation: the MAD is 0
    got = _call_robust_z(fn, same)
    if got.shape != same.shape or not (np.all(np.isfinite(got)) and np.all(got[:3] == 0) and got[3] > 3.5):
        fail(f"robust_z({same.tolist()})", "0 for the three equal ranks, a large finite z for the last",
             np.round(got, 3).tolist(), "when most ranks are identical the MAD is 0: keep it above a tiny floor "
             "(say a billionth of the median)")
    passed("robust_z: median and MAD")


def _call_robust_z(fn, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):  # a MAD of 0 is part of the test: its nan and inf are judged, not warned
        got = attempt("robust_z", fn, x.copy(), shown=f"robust_z({np.round(x, 3).tolist()})")
    try:
        return np.asarray(got, dtype=float)
    except (TypeError, ValueError):
        fail(f"robust_z({np.round(x, 3).tolist()})", "an array of floats, one per value", got,
             "return one score per value, as an array")


# -- the overlap of communication with compute, from a rank's spans -------------------------------------------

def reference_overlap(compute, comm) -> float:
    """alpha_ov from two streams' spans: the time both were busy over the shorter stream's busy time."""
    tc, tm, both = busy_and_both(compute, comm)
    shorter = min(tc, tm)
    return both / shorter if shorter > 0 else 0.0


def _overlap_cases(rng: np.random.Generator) -> list[tuple[list, list]]:
    """Spans like a rank's step: computes back to back with gaps, collectives in flight two at a time."""
    cases = [([(0.0, 4.0), (5.0, 9.0)], [(3.0, 6.0), (4.0, 5.5)]),  # two collectives at once: count them once
             ([(0.0, 2.0)], [(2.0, 3.0)]),  # back to back: nothing hidden
             ([(0.0, 10.0)], [(1.0, 2.0), (3.0, 4.0)])]  # all hidden
    for _ in range(4):
        t, comp = 0.0, []
        for _ in range(int(rng.integers(3, 7))):
            d = float(rng.uniform(1, 5))
            comp.append((t, t + d))
            t += d + float(rng.choice([0.0, rng.uniform(0.2, 2)]))
        starts = np.sort(rng.uniform(0, t, int(rng.integers(3, 7))))
        comm = [(float(s), float(s + rng.uniform(0.5, 4))) for s in starts]
        cases.append((comp, comm))
    return cases


def check_overlap(fn: Callable[[list, list], float]) -> None:
    """``fn(compute_spans, comm_spans)``: the share of the shorter stream's busy time that ran under the other,
    on spans drawn here (collectives in flight together, gaps in the compute)."""
    rng = np.random.default_rng()
    for comp, comm in _overlap_cases(rng):
        shown = f"overlap({_round(comp)}, {_round(comm)})"
        got = number(shown, attempt("overlap", fn, list(comp), list(comm), shown=shown))
        want = reference_overlap(comp, comm)
        if not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12):
            fail(shown, round(want, 6), round(got, 6), _overlap_hint(comp, comm, got))
    passed("overlap: 7 pairs of streams")


def _round(spans) -> list:
    return [(round(a, 2), round(b, 2)) for a, b in spans]


def _overlap_hint(comp, comm, got: float) -> str:
    tc, tm, both = busy_and_both(comp, comm)
    raw_m = sum(b - a for a, b in comm)
    pairwise = sum(max(0.0, min(a1, b1) - max(a0, b0)) for a0, a1 in comp for b0, b1 in comm)
    close_to = lambda x: math.isclose(got, x, rel_tol=1e-6)  # noqa: E731
    if close_to(both):
        return "that is the hidden time in seconds: give it as a share of the shorter stream's busy time"
    if close_to(both / max(tc, tm)):
        return "divide by the shorter stream: at most all of it can hide under the longer one"
    if close_to(both / (max(b for _, b in comp + comm) - min(a for a, _ in comp + comm))):
        return "alpha is a share of the shorter stream's busy time, not of the step"
    if raw_m != tm and (close_to(pairwise / min(tc, raw_m)) or close_to(both / min(tc, raw_m))
                        or close_to(pairwise / min(tc, tm))):
        return ("two collectives in flight at once keep the stream busy once, not twice: merge a stream's spans "
                "where they overlap before measuring it")
    return "measure each stream's busy time, then the time both are busy at once"


# -- the investigation: a diagnosis of a mystery run, against the evidence ---------------------------------------

def _evidence(m) -> dict:
    """Every number the protocol reads from a mystery, with the profiling layer's tools."""
    from minidist.profiling import collective_table, compute_time_per_rank, link_bandwidths, run_budget

    r = m.run
    peak = np.asarray(r.peak_memory, dtype=float)
    comp = np.asarray(compute_time_per_rank(r), dtype=float)
    lo, hi = r.windows[0][-1]
    calls = collective_table(r.trace, 0, m.world_size, window=(lo, hi))
    msgs = [e for e in r.trace.events if e.rank == 0 and e.stream == "link" and lo <= e.start < hi and e.end > e.start]
    busy = sum(e.end - e.start for e in msgs)
    latency = sum(m.cluster.link(0, int(e.name.split("->")[1])).alpha for e in msgs)
    budgets = run_budget(r)
    return {"peak": peak, "peak_z": robust_z(peak), "compute": comp, "compute_z": robust_z(comp),
            "links": link_bandwidths(r.trace), "calls": len(calls),
            "call_bytes": float(np.mean([c["bytes"] for c in calls])) if calls else 0.0,
            "latency": latency / busy if busy > 0 else 0.0,
            "exposed": float(np.mean([b.parts.get("exposed:all_reduce", 0.0) / b.total for b in budgets])),
            "overlap": float(np.mean([b.overlap for b in budgets])),
            "slowdown": r.time[-1] / m.predicted_step}


def _ratio(values: np.ndarray, i: int) -> float:
    return float(values[i] / np.median(values))


def _within(values: np.ndarray) -> str:
    med = float(np.median(values))
    return f"{max(abs(v / med - 1) for v in values):.0%}"


def _link_ratio(ev: dict, link) -> float:
    return ev["links"][link] / float(np.median(list(ev["links"].values())))


def _support(kind: str, subject, ev: dict) -> str:
    """What in the evidence points at the injected fault, in numbers, without naming it."""
    if kind == "memory spike":
        return (f"rank {subject}'s peak memory is {_ratio(ev['peak'], subject):.2f}x the median rank's "
                f"({ev['peak'][subject] / 1e6:.1f} MB against {np.median(ev['peak']) / 1e6:.1f} MB)")
    if kind == "straggler":
        return f"rank {subject} computes {_ratio(ev['compute'], subject):.2f}x as long as the median rank"
    if kind == "stage imbalance":
        groups: dict[float, list[int]] = {}
        for r, t in enumerate(ev["compute"]):
            groups.setdefault(round(float(t) * 1e6, 1), []).append(r)
        return "the ranks compute in groups: " + ", ".join(f"ranks {rs} {t:.1f} us" for t, rs in sorted(groups.items()))
    if kind == "slow link":
        a, b = subject
        return (f"rank {a}'s messages to rank {b} take {1 / _link_ratio(ev, subject):.1f}x as long per byte as the "
                "median link's")
    if kind == "latency-bound communication":
        return (f"rank 0 runs {ev['calls']} all-reduces in one step, of {ev['call_bytes']:,.0f} bytes on average, "
                f"and latency is {ev['latency']:.0%} of its message time")
    return (f"only {ev['overlap']:.0%} of the communication runs under compute, and the step waits on "
            f"{ev['calls']} all-reduce(s) of {ev['call_bytes'] / 1e6:.1f} MB for {ev['exposed']:.0%} of its time")


def _against(kind, subject, ev: dict) -> str | None:
    """Why the evidence contradicts the claim ``kind`` (``subject``); None if nothing does."""
    if kind == "memory spike":
        if ev["peak_z"].max() <= 3.5:
            return (f"every rank's peak memory is within {_within(ev['peak'])} of the median "
                    f"({np.median(ev['peak']) / 1e6:.1f} MB)")
        if not _is_rank(subject, ev) or ev["peak_z"][subject] <= 3.5:
            return _rank_said("peak memory", subject, ev["peak"])
        return None
    if kind == "straggler":
        if ev["compute_z"].max() <= 3.5:
            if ev["compute"].max() > 1.1 * ev["compute"].min():
                return (f"no single rank's compute time stands out from its peers' (the largest robust z-score is "
                        f"{ev['compute_z'].max():.2f})")
            return f"every rank's compute time is within {_within(ev['compute'])} of the median"
        if not _is_rank(subject, ev) or ev["compute_z"][subject] <= 3.5:
            return _rank_said("compute time", subject, ev["compute"])
        return None
    if kind == "stage imbalance":
        if ev["compute_z"].max() > 3.5:
            k = int(ev["compute_z"].argmax())
            return (f"one rank alone stands out (rank {k} computes {_ratio(ev['compute'], k):.2f}x the median) while "
                    "the others compute alike, and ranks of one stage would move together")
        if ev["compute"].max() <= 1.1 * ev["compute"].min():
            return f"every rank's compute time is within {_within(ev['compute'])} of the median"
        return None
    if kind == "slow link":
        link = _as_link(subject)
        if link is None:
            return f"{subject!r} is not a link: name it as (source rank, destination rank)"
        if link not in ev["links"]:
            return f"no message went from rank {link[0]} to rank {link[1]}"
        if _link_ratio(ev, link) > 0.7:
            return (f"rank {link[0]}'s messages to rank {link[1]} move {_link_ratio(ev, link):.2f}x the median "
                    "link's bytes per second")
        return None
    if kind == "latency-bound communication":
        if ev["calls"] < 16 or ev["latency"] < 0.5:
            return (f"rank 0 runs {ev['calls']} all-reduce(s) per step, of {ev['call_bytes']:,.0f} bytes on average, "
                    f"and latency is only {ev['latency']:.0%} of its message time")
        return None
    if kind == "exposed collective":
        if ev["overlap"] >= 0.15:
            return f"{ev['overlap']:.0%} of the communication runs under compute"
        if ev["exposed"] < 0.1:
            return f"the step waits on exposed all-reduces for only {ev['exposed']:.0%} of its time"
        return None
    return None


def _is_rank(subject, ev: dict) -> bool:
    return isinstance(subject, (int, np.integer)) and not isinstance(subject, bool) and 0 <= subject < len(ev["peak"])


def _as_link(subject):
    if isinstance(subject, (tuple, list)) and len(subject) == 2 and all(
            isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in subject):
        return int(subject[0]), int(subject[1])
    return None


def _rank_said(what: str, subject, values: np.ndarray) -> str:
    if not isinstance(subject, (int, np.integer)) or isinstance(subject, bool) or not 0 <= subject < len(values):
        return f"{subject!r} is not a rank of this run (0 to {len(values) - 1})"
    return f"rank {subject}'s {what} is {_ratio(values, subject):.2f}x the median rank's"


PHASE = {"memory spike": "memory", "straggler": "compute", "stage imbalance": "compute",
         "slow link": "communication", "latency-bound communication": "communication",
         "exposed collective": "scaling (overlap and exposed time)"}

REMEDY_HINT = {
    "memory spike": "the extra bytes sit on one rank and cost no time: what holds them?",
    "straggler": "one GPU is slower than its identical peers: no setting of the run makes it faster",
    "stage imbalance": "the work is cut unevenly between the stages",
    "slow link": "one cable or port carries every message at a fraction of its peers' speed",
    "latency-bound communication": "every collective pays the link's latency once, whatever its size",
    "exposed collective": "a bucket's all-reduce cannot start before its last gradient is computed",
}


def mystery_seeds(seed: int | None = None) -> dict[str, int]:
    """One seed of ``md.profiling.mystery_run`` per cause, drawn from ``seed`` (None: afresh), in a random order."""
    from minidist.profiling.mystery import CAUSES, drawn_cause

    rng = np.random.default_rng(seed)
    found: dict[str, int] = {}
    while len(found) < len(CAUSES):
        s = int(rng.integers(1_000, 1_000_000_000))
        found.setdefault(drawn_cause(s), s)
    return {c: found[c] for c in rng.permutation(list(CAUSES))}


def check_diagnosis(fn: Callable, seed: int | None = None) -> None:
    """``fn(mystery) -> (cause, subject, remedy)`` on fresh ``md.profiling.mystery_run`` runs, one of each cause,
    their seeds drawn from ``seed`` (None: anew at each call). A wrong cause is answered with the evidence that
    contradicts it and the evidence of what happened, and the seed that reproduces the run."""
    from minidist.profiling.mystery import CAUSES, REMEDIES, mystery_run

    for s in mystery_seeds(seed).values():
        m = mystery_run(s)
        kind, subject, remedy = m.reveal()
        shown = f"diagnose(md.profiling.mystery_run({s}))"
        got = attempt("diagnose", fn, m, shown=shown)
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            fail(shown, "(cause, subject, remedy)", got,
                 "return three things: a cause of md.profiling.CAUSES, the rank or link it hits (None if it hits no "
                 "single one) and a remedy of md.profiling.REMEDIES")
        cause, said, fix = got
        if cause is not None and cause not in CAUSES:
            fail(f"{shown}: the cause", f"one of {list(CAUSES)} (None: nothing wrong)", cause,
                 "name the cause with one of the strings of md.profiling.CAUSES")
        ev = _evidence(m)
        if cause != kind:
            why = _against(cause, said, ev) if cause is not None else None
            claim = "nothing wrong" if cause is None else f"{cause!r}" + (f" ({said!r})" if said is not None else "")
            but = f"but {why}; " if why else "but "
            raise_failed(f"{shown}: you said {claim}, {but}{_support(kind, subject, ev)}",
                         f"follow the protocol in its order; the {PHASE[kind]} phase holds the evidence here")
        if subject is not None and (said if kind != "slow link" else _as_link(said)) != subject:
            what = {"memory spike": "peak memory", "straggler": "compute time"}.get(kind)
            why = _against(kind, said, ev) or (_rank_said(what, said, ev["peak" if what == "peak memory" else
                                                                          "compute"]) if what else "")
            raise_failed(f"{shown}: the cause is right, but the subject {said!r} is not: {why}; "
                         f"{_support(kind, subject, ev)}",
                         "report the rank (an int) or the link (source rank, destination rank) the evidence singles "
                         "out")
        if fix not in REMEDIES:
            fail(f"{shown}: the remedy", f"one of {list(REMEDIES)}", fix,
                 "name the remedy with one of the keys of md.profiling.REMEDIES")
        if fix != remedy:
            raise_failed(f"{shown}: the cause is right, but {fix!r} does not act on it", REMEDY_HINT[kind])
    passed(f"diagnosis: {len(CAUSES)} fresh mysteries, one of each cause")


def raise_failed(message: str, hint: str) -> None:
    raise CheckFailed(f"{message}\n  hint: {hint}")
