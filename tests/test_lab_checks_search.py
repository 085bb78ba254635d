"""Lab 18's checks accept the right answers, explain the usual wrong ones, and refuse a search that is a grid."""

from __future__ import annotations

import random

import pytest

import minidist as md
from minidist.labs import CheckFailed
from minidist.parallel import ParallelConfig


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


def test_divisible_tells_an_over_strict_filter_which_rule_it_tightened():
    def node_strict(tp, cp, pp, dp, **k):
        return _divisible(tp, cp, pp, dp, **k) and tp * cp < k["gpus_per_node"]

    with pytest.raises(CheckFailed, match="fills the node exactly, and that is allowed") as failure:
        md.labs.check_divisible(node_strict)
    assert "global_batch" not in str(failure.value).split("hint:")[1]

    def heads_over_cp(tp, cp, pp, dp, **k):
        return _divisible(tp, cp, pp, dp, **k) and k["heads"] % (tp * cp) == 0

    with pytest.raises(CheckFailed, match=r"only tp splits the heads \(cp splits the sequence\)"):
        md.labs.check_divisible(heads_over_cp)

    def odd_extra(tp, cp, pp, dp, **k):
        return _divisible(tp, cp, pp, dp, **k) and pp < 4

    with pytest.raises(CheckFailed, match="stricter than needed"):
        md.labs.check_divisible(odd_extra)


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


def _time_misleading(c):  # family 5 holds the best layout, but its representative (knob 0) ranks third
    fam, knob = c
    return [5.0, 3.0, 4.0, 1.0, 6.0, 0.5][fam] + (0.2 if fam == 5 else 0.01) * (knob - 4) ** 2


def _search(fn, time=_time):
    md.labs.check_search(fn, SPACE, lambda c: c[0], lambda g: g[0], time)


def test_search_must_find_the_best_with_fewer_evaluations(capsys):
    _search(_two_level)
    _search(_two_level, _time_misleading)
    assert "the best of 60 layouts after" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="that is the grid"):
        _search(lambda cands, key, rep, ev, keep: min(cands, key=ev))
    with pytest.raises(CheckFailed, match="did not return the best"):  # stopped at the best representative
        _search(lambda cands, key, rep, ev, keep: rep([c for c in cands if c[0] == 3]))
    with pytest.raises(CheckFailed, match="not done yet"):
        _search(lambda *a: (_ for _ in ()).throw(NotImplementedError))


def test_search_refuses_a_grid_with_gaps_and_a_fixed_keep():
    # one family plus the six representatives is the budget for keep = 1
    with pytest.raises(CheckFailed, match=r"keep=1\) evaluated 59 of 60 candidates\n  expected: 'at most 16'"):
        _search(lambda cands, key, rep, ev, keep: min(cands[1:], key=ev))
    with pytest.raises(CheckFailed, match=r"keep=1\) evaluated 40 of 60"):
        _search(lambda cands, key, rep, ev, keep: min(random.Random(0).sample(cands, 40), key=ev))
    with pytest.raises(CheckFailed, match=r"keep=1\) evaluated 33 of 60"):
        _search(lambda cands, key, rep, ev, keep: _two_level(cands, key, rep, ev, 3))
    with pytest.raises(CheckFailed, match=r"keep=3\) did not return the best candidate of the 3 most promising"):
        _search(lambda cands, key, rep, ev, keep: _two_level(cands, key, rep, ev, 1), _time_misleading)


def test_search_names_layouts_by_their_short_labels():
    space = [ParallelConfig(dp=8 // tp, tp=tp, zero_stage=z) for tp in (1, 2, 4) for z in (0, 1, 2, 3)]

    def time(c):
        return 1.0 / c.dp + 0.01 * c.zero_stage

    with pytest.raises(CheckFailed) as failure:
        md.labs.check_search(lambda cands, key, rep, ev, keep: rep([c for c in cands if c.tp == 4]), space,
                             lambda c: c.tp, lambda g: g[-1], time)
    message = str(failure.value)
    assert "expected: 'dp8 tp1 cp1 pp1 ZeRO-0 (0.125)'" in message
    assert "ParallelConfig(" not in message and len(message) < 400


def test_state_bytes_in_gigabytes_is_named():
    with pytest.raises(CheckFailed, match="return bytes, not GB or GiB"):
        md.labs.check_state_bytes(lambda *a: _state(*a) / 1e9)
