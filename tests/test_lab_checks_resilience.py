"""Lab 17's checks accept the right answers and explain the usual wrong ones, without giving the formula away."""

from __future__ import annotations

import math

import numpy as np
import pytest

import minidist as md
from minidist.labs import CheckFailed
from minidist.labs.resilience_checks import daly_interval, exact_overhead, optimal_interval, reshard_reads


def _completion(t, m):
    return m * math.expm1(t / m)


def _overhead(i, c, r, m):
    return (m + r) * math.expm1((i + c) / m) / i - 1


def _golden(c, r, m, overhead=_overhead, steps=100):
    lo, hi = math.log(m) - 25, math.log(m) + 3
    g = (math.sqrt(5) - 1) / 2
    for _ in range(steps):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if overhead(math.exp(a), c, r, m) < overhead(math.exp(b), c, r, m):
            hi = b
        else:
            lo = a
    return math.exp((lo + hi) / 2)


_plan = reshard_reads  # the check's own reference: a right answer


def test_expected_completion_names_the_usual_slips(capsys):
    md.labs.check_expected_completion(_completion)
    assert "ok: expected_completion" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="not a whole T"):
        md.labs.check_expected_completion(lambda t, m: t * math.exp(t / m))
    with pytest.raises(CheckFailed, match="T = 0"):
        md.labs.check_expected_completion(lambda t, m: m * math.exp(t / m))
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_expected_completion(lambda t, m: (_ for _ in ()).throw(NotImplementedError))


def test_expected_overhead_names_the_missing_piece(capsys):
    md.labs.check_expected_overhead(_overhead)
    assert "ok: expected_overhead: 6 cases" in capsys.readouterr().out
    slips = {
        "first-order model": lambda i, c, r, m: c / i + i / (2 * m),
        "failure during the checkpoint": lambda i, c, r, m: _overhead(i, 0.0, r, m),
        "one interval meet on average": lambda i, c, r, m: _overhead(i, c, 0.0, m),
        "one restore per failure, not one per interval": lambda i, c, r, m: (m * math.expm1((i + c) / m) + r) / i - 1,
        "beyond the work itself": lambda i, c, r, m: _overhead(i, c, r, m) + 1,
    }
    for hint, fn in slips.items():
        with pytest.raises(CheckFailed, match=hint):
            md.labs.check_expected_overhead(fn)


def test_best_interval_wants_the_exact_minimum(capsys):
    md.labs.check_checkpoint_interval(_golden)
    assert "ok: best_checkpoint_interval: 6" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="first-order optimum"):
        md.labs.check_checkpoint_interval(lambda c, r, m: math.sqrt(2 * c * m))
    with pytest.raises(CheckFailed, match="Daly's series"):
        md.labs.check_checkpoint_interval(lambda c, r, m: daly_interval(c, m))
    with pytest.raises(CheckFailed, match="refine the search"):  # a grid of 200 points over eight decades
        md.labs.check_checkpoint_interval(lambda c, r, m: min(np.logspace(np.log10(m) - 6, np.log10(m) + 2, 200),
                                                              key=lambda i: _overhead(i, c, r, m)))


def test_the_exact_optimum_is_the_root_and_restore_does_not_move_it():
    for c, m in [(1.0, 3600.0), (600.0, 3600.0), (7200.0, 3600.0)]:
        best = optimal_interval(c, m)
        assert _golden(c, 0.0, m) == pytest.approx(best, rel=1e-6)
        assert _golden(c, 5 * m, m) == pytest.approx(best, rel=1e-6)
        assert exact_overhead(best, c, 0.0, m) <= min(exact_overhead(best * f, c, 0.0, m) for f in (0.99, 1.01))
    assert daly_interval(1.0, 1e6) == pytest.approx(optimal_interval(1.0, 1e6), rel=1e-6)


def test_reshard_plan_wants_local_offsets_of_the_overlapping_files(capsys):
    md.labs.check_reshard_plan(_plan)
    assert "ok: reshard_plan: 9 layouts" in capsys.readouterr().out
    assert reshard_reads(6, 3, 2) == [[(0, 0, 2), (1, 0, 1)], [(1, 1, 2), (2, 0, 2)]]

    def global_offsets(length, old, new):
        a = length // old
        return [[(r, s + r * a, e + r * a) for r, s, e in reads] for reads in _plan(length, old, new)]

    with pytest.raises(CheckFailed, match="starts at 0"):
        md.labs.check_reshard_plan(global_offsets)

    def every_file(length, old, new):
        a, b = length // old, length // new
        return [[(r, min(max(j * b - r * a, 0), a), min(max((j + 1) * b - r * a, 0), a)) for r in range(old)]
                for j in range(new)]

    with pytest.raises(CheckFailed, match="only from the files that overlap"):
        md.labs.check_reshard_plan(every_file)
    with pytest.raises(CheckFailed, match="one list of reads for every new rank"):
        md.labs.check_reshard_plan(lambda length, old, new: _plan(length, old, new)[:-1])
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_reshard_plan(lambda *a: (_ for _ in ()).throw(NotImplementedError))
