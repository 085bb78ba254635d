"""Configuration search (ch27): the grid, a hierarchical and an evolutionary search compared on the number of
model evaluations they spend, and the rules of thumb checked against the winners. The table is printed."""

from __future__ import annotations

import pytest

import minidist as md
from minidist.estimate import search as S

CASES = [("llama3_8b", "dgx-h100", 64), ("llama3_70b", "dgx-h100", 512), ("llama3_405b", "dgx-h100", 16384),
         ("gpt3_175b", "dgx-a100", 1024), ("mixtral_8x7b", "dgx-h100", 256)]


@pytest.fixture(scope="module")
def results():
    out = {}
    for model, cluster, gpus in CASES:
        out[model] = (S.grid_search(model, cluster, gpus), S.hierarchical_search(model, cluster, gpus),
                      S.evolutionary_search(model, cluster, gpus))
    return out


def test_smarter_searches_reach_the_grids_best_for_a_fraction_of_the_evaluations(results):
    lines = [f"{'model':<14} {'grid evals':>10} {'hier evals':>10} {'hier/best':>9} {'evo evals':>9} "
             f"{'evo found at':>12} {'evo/best':>8}"]
    for model, (grid, hier, evo) in results.items():
        lines.append(f"{model:<14} {grid.evaluations:>10} {hier.evaluations:>10} "
                     f"{hier.best.step_time / grid.best.step_time:>9.3f} {evo.evaluations:>9} "
                     f"{evo.first_best_at:>12} {evo.best.step_time / grid.best.step_time:>8.3f}")
        # the grid's best is the best: nothing beats it
        assert grid.best.step_time <= min(hier.best.step_time, evo.best.step_time) * (1 + 1e-12)
        assert hier.evaluations < grid.evaluations / 2 and evo.evaluations < grid.evaluations / 2
        assert hier.best.step_time == pytest.approx(grid.best.step_time)
        # the evolutionary search is a heuristic: the grid's best in four of these five, within 2% on Mixtral
        assert evo.best.step_time == pytest.approx(grid.best.step_time, rel=0.02)
        assert grid.trace[-1] == grid.best.step_time and sorted(grid.trace, reverse=True) == grid.trace
    print("\n" + "\n".join(lines))


def test_hierarchical_search_refines_more_than_one_choice_of_degrees(results):
    """The representative ranks choices of degrees only roughly: refining just the top one misses LLaMA 3
    405B's best by 11% (its representative, 1F1B with micro-batches of one, hides what interleaving gains)."""
    grid = results["llama3_405b"][0]
    narrow = S.hierarchical_search("llama3_405b", "dgx-h100", 16384, keep=1)
    assert narrow.best.step_time > 1.05 * grid.best.step_time


def test_rules_against_the_winners(results):
    """The rules the search's winners obey; those they break are rules of thumb this model disagrees with."""
    broken = {}
    for (model, cluster, _), (grid, _, _) in zip(CASES, results.values()):
        verdict = S.check_rules(grid.best, model, cluster)
        assert set(verdict) == {r.name for r in S.RULES}
        broken[model] = sorted(k for k, ok in verdict.items() if not ok)
    print("\nrules broken by the winner:", broken)
    for model in broken:  # never broken: tp inside a node, ZeRO-1 with pipelines, recompute only what must be
        assert not {"tp-in-node", "zero1-with-pp", "recompute-only-if-needed"} & set(broken[model])
    # context parallelism at 8K tokens and pipelines for models whose state would fit: the model's winners
    # use both against the rules (cp hides its ring behind attention; pp shrinks the DP traffic)
    assert "cp-only-for-long" in broken["llama3_70b"] and "no-pp-if-it-fits" in broken["gpt3_175b"]


def test_advice_is_a_valid_layout_slower_than_the_search(results):
    for model, cluster, gpus in CASES:
        lay = S.advise(model, cluster, gpus)
        assert lay.gpus == gpus and lay.tp <= md.estimate.cluster(cluster).gpus_per_node
        grid = results[model][0]
        m = md.estimate.model(model)
        est = md.estimate.estimate_layout(m, md.estimate.cluster(cluster), lay, grid.best.global_batch,
                                          grid.best.seq_len, md.estimate.CALIBRATED)
        assert est.step_time >= grid.best.step_time * (1 - 1e-12)


def test_search_arguments_are_checked():
    with pytest.raises(ValueError, match="^grid_search: gpus"):
        S.grid_search("llama3_8b", "dgx-h100", 0)
    with pytest.raises(ValueError, match="^hierarchical_search: keep"):
        S.hierarchical_search("llama3_8b", "dgx-h100", 64, keep=0)
    with pytest.raises(ValueError, match="^evolutionary_search: population"):
        S.evolutionary_search("llama3_8b", "dgx-h100", 64, population=float("nan"))
