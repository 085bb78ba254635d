"""Lab 14 checks accept the right answers and reject the typical wrong ones with the intended hint."""

import math

import pytest

import minidist as md
from minidist.labs import CheckFailed


def ckpt_good(L, k, layer, inp):
    return math.ceil(L / k) * inp + k * layer


def best_good(L, layer, inp):
    return min(range(1, L + 1), key=lambda k: (ckpt_good(L, k, layer, inp), k))


def test_checkpointed_bytes(capsys):
    md.labs.check_checkpointed_bytes(ckpt_good)
    assert "ok: checkpointed_bytes" in capsys.readouterr().out
    for wrong, match in [
        (lambda L, k, m, b: (L / k + k) * m, "only the segment's input"),
        (lambda L, k, m, b: (L // k) * b + k * m, "ceil\\(L/k\\)"),
        (lambda L, k, m, b: math.ceil(L / k) * b, "add its k layers"),
        (lambda L, k, m, b: L * m, "without checkpointing"),
        (lambda L, k, m, b: None, "return"),
    ]:
        with pytest.raises(CheckFailed, match=match):
            md.labs.check_checkpointed_bytes(wrong)


def test_best_interval(capsys):
    md.labs.check_best_interval(best_good)
    # any minimiser is accepted: the largest k among ties too
    md.labs.check_best_interval(lambda L, m, b: max(range(1, L + 1), key=lambda k: (-ckpt_good(L, k, m, b), k)))
    assert capsys.readouterr().out.count("ok: best_interval") == 2
    with pytest.raises(CheckFailed, match="sqrt\\(L\\) is optimal only"):
        md.labs.check_best_interval(lambda L, m, b: round(math.sqrt(L)))
    with pytest.raises(CheckFailed, match="outside 1..L"):
        md.labs.check_best_interval(lambda L, m, b: 0)
    with pytest.raises(CheckFailed, match="whole number"):
        md.labs.check_best_interval(lambda L, m, b: math.sqrt(L * b / m))
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_best_interval(lambda L, m, b: (_ for _ in ()).throw(NotImplementedError))


def test_overlap_tokens():
    md.labs.check_overlap_tokens(lambda f, b: f / b)
    assert 312e12 / 32e9 == 9750  # the book's A100 + PCIe Gen4 figure
    with pytest.raises(CheckFailed, match="upside down"):
        md.labs.check_overlap_tokens(lambda f, b: b / f)
    with pytest.raises(CheckFailed, match="24 h\\^2 cancels"):
        md.labs.check_overlap_tokens(lambda f, b: 3 * f / b)


def test_exact_peak_accepts_the_walk_and_names_the_upper_bound():
    from minidist.labs.recompute_checks import _exact_peak, _ref_bytes

    md.labs.check_exact_peak(_exact_peak)
    with pytest.raises(CheckFailed, match="an upper bound"):
        md.labs.check_exact_peak(_ref_bytes)
    with pytest.raises(CheckFailed, match="its own kept input is still alive"):
        md.labs.check_exact_peak(lambda L, k, lb, ib: _exact_peak(L, k, lb, ib) - ib)


def test_plan_recompute_wants_the_cheapest_set_not_the_greedy_one():
    import itertools

    def exhaustive(ops, need):
        best = None
        for n in range(len(ops) + 1):
            for combo in itertools.combinations(ops, n):
                if sum(o[1] for o in combo) >= need and (best is None or sum(o[2] for o in combo) <
                                                         sum(o[2] for o in best)):
                    best = combo
        return None if best is None else [o[0] for o in best]

    def greedy(ops, need):
        chosen, freed = [], 0.0
        for o in sorted(ops, key=lambda o: -o[1] / (o[2] or 1e-30)):
            if freed >= need:
                break
            chosen.append(o[0])
            freed += o[1]
        return chosen if freed >= need else None

    md.labs.check_plan_recompute(exhaustive)
    with pytest.raises(CheckFailed, match="compare whole sets"):
        md.labs.check_plan_recompute(greedy)
    with pytest.raises(CheckFailed, match="frees too little"):
        md.labs.check_plan_recompute(lambda ops, need: [ops[0][0]])
    with pytest.raises(CheckFailed, match="return None"):
        md.labs.check_plan_recompute(lambda ops, need: exhaustive(ops, need) or [])
