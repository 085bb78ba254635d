"""Lab 18's checks accept the right answers, explain the usual wrong ones, and refuse a search that is a grid."""

from __future__ import annotations

import pytest

import minidist as md
from minidist.labs import CheckFailed


def _divisible(tp, cp, pp, dp, *, heads, layers, gpus, gpus_per_node, global_batch, micro_batch):
    return (tp * cp * pp * dp == gpus and heads % tp == 0 and tp * cp <= gpus_per_node and layers % pp == 0
            and global_batch % (dp * micro_batch) == 0)


def test_divisible_names_the_constraint_that_was_forgotten(capsys):
    md.labs.check_divisible(_divisible)
    assert "ok: divisible" in capsys.readouterr().out
    slips = {
        "heads % tp": lambda tp, cp, pp, dp, **k: _divisible(tp, cp, pp, dp, **{**k, "heads": 48}),
        "gpus_per_node": lambda tp, cp, pp, dp, **k: _divisible(tp, cp, pp, dp, **{**k, "gpus_per_node": 64}),
        "layers % pp": lambda tp, cp, pp, dp, **k: _divisible(tp, cp, pp, dp, **{**k, "layers": 40}),
        "micro_batch": lambda tp, cp, pp, dp, **k: _divisible(tp, cp, pp, dp, **{**k, "micro_batch": 1}),
        "= gpus": lambda tp, cp, pp, dp, **k: _divisible(tp, cp, pp, 64 // (tp * cp * pp) or 1, **k),
    }
    for hint, fn in slips.items():
        with pytest.raises(CheckFailed, match=hint.replace("%", "%").replace("+", r"\+")):
            md.labs.check_divisible(fn)


def _state(params, tp, pp, dp, z):
    local = params / (tp * pp)
    return 2 * local / (dp if z >= 3 else 1) + 2 * local / (dp if z >= 2 else 1) + 12 * local / (dp if z >= 1 else 1)


def test_state_bytes_catches_forgotten_model_parallelism_and_zero_all_at_once():
    md.labs.check_state_bytes(_state)
    with pytest.raises(CheckFailed, match="divide the parameters by tp x pp"):
        md.labs.check_state_bytes(lambda params, tp, pp, dp, z: _state(params * tp * pp, tp, pp, dp, z))
    with pytest.raises(CheckFailed, match="ZeRO-1 shards only the optimizer"):
        md.labs.check_state_bytes(lambda params, tp, pp, dp, z: 16 * params / (tp * pp * dp))


def test_dp_comm_ratio_catches_the_two_factors():
    md.labs.check_dp_comm_ratio(lambda t, f, b: 2 * f / (3 * t * b))
    with pytest.raises(CheckFailed, match="2 \\(p-1\\)/p"):
        md.labs.check_dp_comm_ratio(lambda t, f, b: f / (3 * t * b))
    with pytest.raises(CheckFailed, match="6 Psi"):
        md.labs.check_dp_comm_ratio(lambda t, f, b: 2 * f / (t * b))


def _two_level(candidates, key, representative, evaluate, keep):
    groups: dict = {}
    for c in candidates:
        groups.setdefault(key(c), []).append(c)
    ranked = sorted(groups, key=lambda k: evaluate(representative(groups[k])))
    return min((c for k in ranked[:keep] for c in groups[k]), key=evaluate)


# a space of 60 candidates: 6 families whose members differ by a small tuning term
SPACE = [(fam, knob) for fam in range(6) for knob in range(10)]


def _time(c):
    fam, knob = c
    return [5.0, 3.0, 4.0, 1.0, 6.0, 2.0][fam] + 0.01 * (knob - 4) ** 2


def test_search_must_find_the_best_with_fewer_evaluations(capsys):
    md.labs.check_search(_two_level, SPACE, lambda c: c[0], lambda g: g[0], _time)
    assert "the best of 60 layouts after" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="that is the grid"):
        md.labs.check_search(lambda cands, key, rep, ev, keep: min(cands, key=ev), SPACE, lambda c: c[0],
                             lambda g: g[0], _time)
    with pytest.raises(CheckFailed, match="did not return the best"):  # stopped at the best representative
        md.labs.check_search(lambda cands, key, rep, ev, keep: rep([c for c in cands if c[0] == 3]), SPACE,
                             lambda c: c[0], lambda g: g[0], _time)
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_search(lambda *a: (_ for _ in ()).throw(NotImplementedError), SPACE, lambda c: c[0],
                             lambda g: g[0], _time)
