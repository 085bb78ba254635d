"""Lab 23's checks accept the right answers and explain the usual wrong ones."""

from __future__ import annotations

import re

import numpy as np
import pytest

import minidist as md
from minidist.labs import CheckFailed
from minidist.labs.profiling_checks import mystery_seeds
from minidist.profiling import bus_factor, robust_z


def test_overlap_fraction_divides_by_the_shorter_stream(capsys):
    md.labs.check_overlap_fraction(lambda c, m, t: (c + m - t) / min(c, m))
    assert "ok: overlap_fraction" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="shorter stream"):
        md.labs.check_overlap_fraction(lambda c, m, t: (c + m - t) / max(c, m))
    with pytest.raises(CheckFailed, match="not of the step"):
        md.labs.check_overlap_fraction(lambda c, m, t: (c + m - t) / t)


def test_bus_bandwidth_factors():
    md.labs.check_bus_bandwidth(lambda a, op, p: a * bus_factor(op, p))
    with pytest.raises(CheckFailed, match="reduce-scatter then an all-gather"):
        md.labs.check_bus_bandwidth(lambda a, op, p: a * (p - 1) / p if op != "broadcast" else a)


def test_robust_z_takes_either_form_of_the_score_and_needs_a_floor_under_the_mad():
    def mad(x):
        return np.median(np.abs(x - np.median(x)))

    md.labs.check_robust_z(lambda x: 0.6745 * (x - np.median(x)) / max(mad(x), 1e-9 * abs(np.median(x))))
    with pytest.raises(CheckFailed, match="estimates a standard deviation"):
        md.labs.check_robust_z(lambda x: (x - np.median(x)) / max(mad(x), 1e-9))
    with pytest.raises(CheckFailed, match="tiny floor"):
        md.labs.check_robust_z(lambda x: (x - np.median(x)) / (1.4826 * mad(x)))


def test_robust_z_refuses_the_plain_z_score():
    md.labs.check_robust_z(robust_z)
    with pytest.raises(CheckFailed, match="plain z-score"):
        md.labs.check_robust_z(lambda x: (x - x.mean()) / x.std())
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_robust_z(lambda x: (_ for _ in ()).throw(NotImplementedError))
    assert np.isfinite(robust_z(np.ones(4))).all()


def test_robust_z_names_a_crash_a_scalar_and_a_lost_sign():
    with pytest.raises(CheckFailed, match=r"robust_z\(\[.*\]\) raised \w*TypeError"):
        md.labs.check_robust_z(lambda x: x + "a")
    with pytest.raises(CheckFailed, match=r"return one score per value: an array of shape \(8,\), not \(\)"):
        md.labs.check_robust_z(lambda x: float(np.median(x)))
    with pytest.raises(CheckFailed, match="keep the sign"):
        md.labs.check_robust_z(lambda x: np.abs(robust_z(x)))


# -- the overlap of two streams, from their spans -------------------------------------------------------------

def _union(spans):
    merged = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return merged


def _both(c, m):
    return sum(max(0.0, min(c1, m1) - max(c0, m0)) for c0, c1 in c for m0, m1 in m)


def _overlap(compute, comm):
    c, m = _union(compute), _union(comm)
    shorter = min(sum(b - a for a, b in c), sum(b - a for a, b in m))
    return _both(c, m) / shorter if shorter > 0 else 0.0


def test_overlap_merges_each_stream_and_divides_by_the_shorter(capsys):
    md.labs.check_overlap(_overlap)
    assert "ok: overlap" in capsys.readouterr().out

    def unmerged(compute, comm):  # two collectives in flight count twice
        shorter = min(sum(b - a for a, b in compute), sum(b - a for a, b in comm))
        return _both(compute, comm) / shorter

    with pytest.raises(CheckFailed, match="merge a stream's spans"):
        md.labs.check_overlap(unmerged)

    def longer(compute, comm):
        c, m = _union(compute), _union(comm)
        return _both(c, m) / max(sum(b - a for a, b in c), sum(b - a for a, b in m))

    with pytest.raises(CheckFailed, match="divide by the shorter stream"):
        md.labs.check_overlap(longer)
    with pytest.raises(CheckFailed, match="hidden time in seconds"):
        md.labs.check_overlap(lambda compute, comm: _both(_union(compute), _union(comm)))


def test_overlap_matches_the_profile_of_a_run():
    from minidist.labs.profiling_checks import reference_overlap

    m = md.profiling.mystery_run(12, "exposed collective")
    run = m.run

    def spans(rank, stream):
        lo, hi = run.windows[rank][-1]
        return [(max(e.start, lo), min(e.end, hi)) for e in run.trace.events
                if e.rank == rank and e.stream == stream and e.end > lo and e.start < hi]

    for rank, budget in enumerate(md.profiling.run_budget(run)):
        assert reference_overlap(spans(rank, "compute"), spans(rank, "comm")) == pytest.approx(budget.overlap,
                                                                                                abs=1e-12)


# -- the diagnosis of fresh mystery runs ---------------------------------------------------------------------

def diagnose(m):
    """The lab's diagnosis, in the protocol's order: memory, compute, communication, scaling."""
    run = m.run
    peak = robust_z(np.array(run.peak_memory))
    if peak.max() > 3.5:
        return "memory spike", int(peak.argmax()), "free the buffer"
    compute = np.array(md.profiling.compute_time_per_rank(run))
    z = robust_z(compute)
    if z.max() > 3.5:
        return "straggler", int(z.argmax()), "replace the GPU"
    if compute.max() > 1.1 * compute.min():
        return "stage imbalance", None, "rebalance the stages"
    bw = md.profiling.link_bandwidths(run.trace)
    slowest = min(bw, key=bw.get)
    if bw[slowest] < 0.7 * np.median(list(bw.values())):
        return "slow link", slowest, "replace the link"
    calls = md.profiling.collective_table(run.trace, 0, m.world_size, window=run.windows[0][-1])
    if md.profiling.run_budget(run)[0].overlap < 0.15:
        return "exposed collective", None, "smaller buckets"
    if len(calls) > 16:
        return "latency-bound communication", None, "larger buckets"
    return None, None, None


SEED = 23
SEEDS = mystery_seeds(SEED)  # the seed of the mystery of each cause that check_diagnosis(seed=SEED) runs


def _except(cause: str, answer):
    """The right diagnosis for every mystery but those of ``cause``, which get ``answer``."""
    return lambda m: answer if m.reveal()[0] == cause else m.reveal()


def test_the_reference_diagnosis_passes_on_fresh_seeds(capsys):
    md.labs.check_diagnosis(diagnose)  # seeds drawn anew
    assert "ok: diagnosis: 6 fresh mysteries" in capsys.readouterr().out


def test_a_straggler_said_of_a_slow_link_is_answered_with_the_evidence():
    m = md.profiling.mystery_run(SEEDS["slow link"])
    src, dst = m.reveal()[1]
    with pytest.raises(CheckFailed) as info:
        md.labs.check_diagnosis(_except("slow link", ("straggler", 3, "replace the GPU")), seed=SEED)
    msg = str(info.value)
    assert f"mystery_run({SEEDS['slow link']}))" in msg and "you said 'straggler' (3)" in msg
    # what contradicts the claim, then what the evidence does single out, in numbers
    assert "but every rank's compute time is within 0% of the median" in msg
    assert re.search(rf"rank {src}'s messages to rank {dst} take \d+\.\dx as long per byte as the median link's",
                     msg), msg
    assert "communication phase" in msg and "slow link" not in msg.split("hint:")[1]


def test_each_wrong_cause_names_the_evidence_against_it():
    cases = [("straggler", ("stage imbalance", None, "rebalance the stages"),
              r"one rank alone stands out \(rank \d computes \d\.\d\dx the median\)"),
             ("stage imbalance", ("straggler", 1, "replace the GPU"),
              r"no single rank's compute time stands out .* the ranks compute in groups"),
             ("memory spike", (None, None, None), r"you said nothing wrong, but rank \d's peak memory is \d\.\d\dx"),
             ("exposed collective", ("latency-bound communication", None, "larger buckets"),
              r"rank 0 runs 1 all-reduce\(s\) per step.*only \d+% of the communication runs under compute"),
             ("latency-bound communication", ("exposed collective", None, "smaller buckets"),
              r"\d+% of the communication runs under compute; rank 0 runs \d+ all-reduces in one step"),
             ("slow link", ("memory spike", 2, "free the buffer"),
              r"every rank's peak memory is within 0% of the median")]
    for cause, answer, pattern in cases:
        with pytest.raises(CheckFailed, match=pattern):
            md.labs.check_diagnosis(_except(cause, answer), seed=SEED)


def test_the_right_cause_with_the_wrong_subject_or_remedy():
    m = md.profiling.mystery_run(SEEDS["straggler"])
    wrong = (m.reveal()[1] + 1) % m.world_size
    with pytest.raises(CheckFailed, match=rf"the subject {wrong} is not: rank {wrong}'s compute time is 1\.00x"):
        md.labs.check_diagnosis(_except("straggler", ("straggler", wrong, "replace the GPU")), seed=SEED)
    with pytest.raises(CheckFailed, match="cannot start before its last gradient"):
        md.labs.check_diagnosis(_except("exposed collective", ("exposed collective", None, "larger buckets")),
                                seed=SEED)
    with pytest.raises(CheckFailed, match="keys of md.profiling.REMEDIES"):
        md.labs.check_diagnosis(_except("straggler", ("straggler", m.reveal()[1], "reboot")), seed=SEED)


def test_a_malformed_diagnosis_is_named():
    with pytest.raises(CheckFailed, match="return three things"):
        md.labs.check_diagnosis(lambda m: "straggler", seed=SEED)
    with pytest.raises(CheckFailed, match="one of the strings of md.profiling.CAUSES"):
        md.labs.check_diagnosis(lambda m: ("bad cable", None, "replace the link"), seed=SEED)
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_diagnosis(lambda m: (_ for _ in ()).throw(NotImplementedError), seed=SEED)
