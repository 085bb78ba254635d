"""Checks for lab 12, expert parallelism (book chapter 18).

* :func:`check_top_k_routing`: softmax, top-k in decreasing probability, gates renormalised over the chosen.
* :func:`check_capacity_keep`: which assignments survive a capacity (first choices first, earlier tokens first).
* :func:`check_dispatch_splits`: how many rows a rank sends to each ep rank in the dispatch all-to-all.
* :func:`check_aux_loss`: the Switch load-balancing loss E sum_i f_i P_i.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from minidist.labs.check import attempt, fail, number, passed


def _call(name: str, fn: Callable, *args, hint: str = ""):
    return attempt(name, fn, *args, shown=name, hint=hint)


def _softmax(x: np.ndarray) -> np.ndarray:
    p = np.exp(x - x.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def _ref_route(logits: np.ndarray, k: int):
    """md.nn.MoE's rule: the k largest probabilities, renormalised when k > 1 (Switch keeps the raw one at k = 1)."""
    p = _softmax(logits)
    experts = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    g = np.take_along_axis(p, experts, -1)
    return experts, g / g.sum(-1, keepdims=True) if k > 1 else g


def check_top_k_routing(route: Callable) -> None:
    """``route(logits (N, E), k) -> (experts (N, k) ints, gates (N, k))``."""
    rng = np.random.default_rng(0)
    n = 0
    for N, E, k in ((6, 4, 1), (10, 8, 2), (5, 16, 4)):
        logits = rng.normal(size=(N, E)) * 2
        want_e, want_g = _ref_route(logits, k)
        out = _call("route", route, logits.copy(), k)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            fail("route must return (experts, gates)", "a pair of arrays", type(out).__name__)
        got_e, got_g = (np.asarray(x) for x in out)
        if got_e.shape != (N, k) or got_g.shape != (N, k):
            fail(f"route(logits {logits.shape}, k={k}): shapes", ((N, k), (N, k)), (got_e.shape, got_g.shape),
                 "one row per token, one column per chosen expert")
        if not np.array_equal(np.sort(got_e, -1), np.sort(want_e, -1)):
            fail(f"route(k={k}): the chosen experts of token 0", want_e[0].tolist(), got_e[0].tolist(),
                 "keep the k experts of largest probability (np.argsort(-p) or np.argpartition)")
        if not np.array_equal(got_e, want_e):
            fail(f"route(k={k}): the order of the chosen experts of token 0", want_e[0].tolist(), got_e[0].tolist(),
                 "list them in decreasing probability: the first column is each token's first choice")
        if not np.allclose(got_g, want_g, rtol=1e-10):
            if k == 1:  # the lab's text: Switch Transformer and md.nn.MoE keep the raw probability at k = 1
                hint = ("with k = 1 keep the raw probability as the gate (as Switch Transformer and md.nn.MoE do): "
                        "the softmax probability of the chosen expert, not renormalised")
                if np.allclose(got_g, 1.0):
                    hint += "; renormalised, every gate is 1 and the router would learn nothing through it"
            else:
                hint = "renormalise: divide the chosen probabilities by their sum, so each token's gates add up to 1"
                raw = np.take_along_axis(_softmax(logits), want_e, -1)
                if np.allclose(got_g, raw, rtol=1e-10):
                    hint = "these are the raw probabilities; " + hint
            fail(f"route(k={k}): gates of token 0", want_g[0].tolist(), got_g[0].tolist(), hint)
        n += 1
    passed(f"check_top_k_routing: {n} cases (top-1 raw, top-2 and top-4 renormalised)")


def check_capacity_keep(keep: Callable) -> None:
    """``keep(experts (N, k), n_experts, capacity) -> bool (N, k)``: True where an assignment fits."""
    from minidist.nn.moe import keep_mask, level_counts, quotas

    rng = np.random.default_rng(1)
    cases = [(np.array([[0, 1], [0, 1], [0, 2], [1, 0]]), 3, 2)]
    for N, E, k, cap in ((12, 4, 1, 2), (16, 4, 2, 5), (20, 8, 2, 3)):
        cases.append((np.stack([rng.permutation(E)[:k] for _ in range(N)]), E, cap))
    for experts, E, cap in cases:
        want = keep_mask(experts, quotas(level_counts(experts, E)[None], cap)[0])
        got = np.asarray(_call("keep", keep, experts.copy(), E, cap), dtype=bool)
        if got.shape != want.shape:
            fail("keep: shape of the mask", want.shape, got.shape, "one entry per (token, choice)")
        if not np.array_equal(got, want):
            loads = [int(got[experts == e].sum()) for e in range(E)]
            hint = ("serve all first choices (column 0, tokens in order) before any second choice, and stop an "
                    "expert at `capacity` assignments")
            if max(loads) > cap:
                hint = f"an expert kept {max(loads)} assignments but the capacity is {cap}; " + hint
            bad = np.argwhere(got != want)[0]
            fail(f"keep(capacity={cap}): token {bad[0]}, choice {bad[1]} (expert {experts[bad[0], bad[1]]})",
                 bool(want[tuple(bad)]), bool(got[tuple(bad)]), hint)
    passed(f"check_capacity_keep: {len(cases)} cases")


def check_dispatch_splits(splits: Callable) -> None:
    """``splits(experts (N, k), keep (N, k), n_experts, ep) -> list of ep row counts`` sent to each ep rank
    (experts are placed in contiguous blocks of E/ep)."""
    rng = np.random.default_rng(2)
    for N, E, k, ep in ((8, 4, 1, 2), (12, 8, 2, 4), (10, 8, 2, 2)):
        experts = np.stack([rng.permutation(E)[:k] for _ in range(N)])
        kept = rng.random((N, k)) < 0.8
        want = [int(kept[(experts // (E // ep)) == q].sum()) for q in range(ep)]
        got = _call("splits", splits, experts.copy(), kept.copy(), E, ep)
        got = [int(x) for x in np.asarray(got).reshape(-1)]
        if got != want:
            hint = "expert e lives on ep rank e // (E / ep); count only the kept assignments"
            if got == [int(((experts // (E // ep)) == q).sum()) for q in range(ep)]:
                hint = "dropped assignments are not sent: count only where keep is True"
            elif got == [int(kept[(experts % ep) == q].sum()) for q in range(ep)]:
                hint = "experts are placed in contiguous blocks: rank q holds experts q E/ep .. (q+1) E/ep - 1"
            fail(f"splits(E={E}, ep={ep})", want, got, hint)
    passed("splits: 3 cases")


def check_aux_loss(aux: Callable) -> None:
    """``aux(probs (N, E), experts (N, k)) -> E sum_i f_i P_i`` with f_i the fraction of the N k assignments
    that chose expert i and P_i the mean probability of expert i."""
    rng = np.random.default_rng(3)
    for N, E, k in ((16, 4, 1), (20, 8, 2)):
        probs = _softmax(rng.normal(size=(N, E)))
        experts = np.argsort(-probs, axis=-1)[:, :k]
        f = np.bincount(experts.reshape(-1), minlength=E) / (N * k)
        want = E * float((f * probs.mean(0)).sum())
        got = float(_call("aux", aux, probs.copy(), experts.copy()))
        if not np.isclose(got, want, rtol=1e-10):
            hint = "E * sum_i f_i P_i; f_i counts assignments (N k of them), P_i averages probabilities over tokens"
            if np.isclose(got * E, want):
                hint = "multiply by E, so that uniform routing gives 1"
            elif np.isclose(got, want * k):
                hint = "f_i is a fraction of the N k assignments: divide the counts by N k, not N"
            fail(f"aux(N={N}, E={E}, k={k})", want, got, hint)
    # an expert nobody chose (the last): its f_i is 0, and a count that forgets it is one entry short
    probs = _softmax(rng.normal(size=(12, 4)) - np.array([0, 0, 0, 9.0]))
    experts = np.argsort(-probs, axis=-1)[:, :1]
    assert 3 not in experts
    want = 4 * float((np.bincount(experts.reshape(-1), minlength=4) / 12 * probs.mean(0)).sum())
    unused = "an expert that no token chose still counts, with f_i = 0: np.bincount(..., minlength=E)"
    got = number("aux with an expert nobody chose", _call("aux", aux, probs.copy(), experts.copy(), hint=unused))
    if not np.isclose(got, want, rtol=1e-10):
        fail("aux with an expert nobody chose (N=12, E=4, k=1)", want, got, unused)
    uniform = np.full((8, 4), 0.25)
    got = float(_call("aux", aux, uniform, np.arange(8)[:, None] % 4))
    if not np.isclose(got, 1.0):
        fail("aux at uniform routing", 1.0, got, "with f_i = P_i = 1/E the loss is E * E * (1/E)^2 = 1")
    passed("aux: 4 cases (1 at uniform routing, 1 with an expert nobody chose)")
