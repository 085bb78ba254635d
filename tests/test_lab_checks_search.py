"""Lab 18's checks accept the right answers, explain the usual wrong ones, and refuse a search that is a grid."""

from __future__ import annotations

import itertools
import random

import pytest

import minidist as md
from minidist.labs import CheckFailed
from minidist.parallel import ParallelConfig


def _layouts(gpus, *, heads, layers, gpus_per_node, global_batch, micro_batches=(1, 2, 4, 8), rules=None):
    rules = rules or {}
    powers = [2**i for i in range(gpus_per_node.bit_length())]
    out = []
    for tp, cp, mb in itertools.product(powers, powers, micro_batches):
        for pp in range(1, layers + 1):
            if gpus % (tp * cp * pp):
                continue
            dp = gpus // (tp * cp * pp)
            ok = {"heads": heads % tp == 0, "node": tp * cp <= gpus_per_node, "layers": layers % pp == 0,
                  "batch": global_batch % (dp * mb) == 0}
            ok.update({k: f(tp, cp, pp, dp, mb, heads, gpus_per_node) for k, f in rules.items()})
            if all(ok.values()):
                out.append((tp, cp, pp, dp, mb))
    return out


def test_layouts_names_the_rule_a_wrong_enumeration_breaks(capsys):
    md.labs.check_layouts(_layouts)
    assert "ok: layouts: 4 machines" in capsys.readouterr().out
    slips = {  # a rule forgotten (or loosened) is named by the layout that breaks it
        "heads do not split": {"heads": lambda tp, cp, pp, dp, mb, h, n: True},
        "leaves the node": {"node": lambda tp, cp, pp, dp, mb, h, n: True},
        "equal pipeline stages": {"layers": lambda tp, cp, pp, dp, mb, h, n: True},
        "whole micro-batches": {"batch": lambda tp, cp, pp, dp, mb, h, n: True},
        # stricter than the rules
        "fill the node exactly": {"node": lambda tp, cp, pp, dp, mb, h, n: tp * cp < n},
        r"only tp splits the heads \(cp splits the sequence\)":
            {"heads": lambda tp, cp, pp, dp, mb, h, n: h % (tp * cp) == 0},
        "not only powers of two": {"pow2": lambda tp, cp, pp, dp, mb, h, n: pp & (pp - 1) == 0},
    }
    for hint, rules in slips.items():
        with pytest.raises(CheckFailed, match=hint):
            md.labs.check_layouts(lambda g, rules=rules, **k: _layouts(g, rules=rules, **k))
    with pytest.raises(CheckFailed, match="try every power of two for cp"):
        md.labs.check_layouts(lambda g, **k: [x for x in _layouts(g, **k) if x[1] == 1])
    with pytest.raises(CheckFailed, match="micro-batch size"):
        md.labs.check_layouts(lambda g, **k: [x for x in _layouts(g, **k) if x[4] == 1])
    with pytest.raises(CheckFailed, match="twice"):
        md.labs.check_layouts(lambda g, **k: _layouts(g, **k) * 2)
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_layouts(lambda *a, **k: (_ for _ in ()).throw(NotImplementedError))


def _state(params, tp, pp, dp, z):
    local = params / (tp * pp)
    return 2 * local / (dp if z >= 3 else 1) + 2 * local / (dp if z >= 2 else 1) + 12 * local / (dp if z >= 1 else 1)


def test_state_bytes_catches_forgotten_model_parallelism_and_zero_all_at_once():
    md.labs.check_state_bytes(_state)
    with pytest.raises(CheckFailed, match="divide the parameters by tp x pp"):
        md.labs.check_state_bytes(lambda params, tp, pp, dp, z: _state(params * tp * pp, tp, pp, dp, z))
    with pytest.raises(CheckFailed, match="ZeRO-1 shards only the optimizer"):
        md.labs.check_state_bytes(lambda params, tp, pp, dp, z: 16 * params / (tp * pp * dp))


def _exposed(t, p, f, b, o):
    compute, comm = 6 * t / f, 2 * (p - 1) / p * 2 / b
    return (comm - min(o * comm, 2 / 3 * compute)) / compute


def test_dp_exposed_names_the_missing_idea(capsys):
    md.labs.check_dp_exposed(_exposed)
    assert "ok: dp_exposed: 6 cases" in capsys.readouterr().out
    slips = {
        "p - 1 times": lambda t, p, f, b, o: (4 / b - min(o * 4 / b, 4 * t / f)) / (6 * t / f),
        "never more than the backward": lambda t, p, f, b, o: _exposed(t, p, f, b, 0.0) * (1 - o),
        "forward third": lambda t, p, f, b, o: (lambda c, r: (r - min(o * r, c)) / c)(6 * t / f, 4 * (p - 1) / p / b),
        "bf16 gradients are 2 bytes": lambda t, p, f, b, o: _exposed(t, p, f, b / 2, o),
    }
    for hint, fn in slips.items():
        with pytest.raises(CheckFailed, match=hint):
            md.labs.check_dp_exposed(fn)


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
