"""Checks for lab 19, gradient compression (book chapter 28): QSGD's stochastic rounding, top-k with error
feedback, and PowerSGD's bytes, each against a reference."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from minidist.labs.check import attempt, check_cases, fail, passed


def check_stochastic_round(fn: Callable[[np.ndarray, int, np.random.Generator], np.ndarray]) -> None:
    """``fn(v, levels, rng)`` for ``v`` in [0, 1]: each entry becomes the value of one of the levels 0, 1/s, ..., 1
    (not its index), rounded up with probability equal to its distance from the level below (so the mean is ``v``)."""
    v = np.array([0.0, 0.1, 0.25, 0.5, 0.74, 0.999, 1.0])
    for s in (1, 4, 10):
        shown = f"stochastic_round(v, {s}, rng)"
        draws = np.stack([np.asarray(attempt("stochastic_round", fn, v.copy(), s, np.random.default_rng(i),
                                             shown=shown), float) for i in range(4000)])
        if draws.shape[1:] != v.shape:
            fail(f"stochastic_round(v of shape {v.shape}, {s}, rng)", v.shape, draws.shape[1:],
                 "round every entry: the result has the shape of v")
        on_levels = np.allclose(draws * s, np.round(draws * s), atol=1e-9)
        if not on_levels:
            fail(f"stochastic_round(v, {s}, rng): values off the levels k/{s}", "multiples of 1/levels",
                 sorted(set(np.round(draws.ravel(), 4)))[:6], "scale v by levels, round, and scale back")
        index = np.all((draws >= np.floor(v * s) - 1e-9) & (draws <= np.ceil(v * s) + 1e-9)) and draws.max() > 1
        if index:  # xi in 0..s rather than xi / s: on the grid, but every value above 1 is off by the factor s
            fail(f"stochastic_round(v, {s}, rng): values above 1", f"levels k/{s} in [0, 1]",
                 [float(d) for d in sorted(set(np.round(draws.ravel(), 4)))[:6]],
                 "these are the indices k of the levels: divide by levels to return the level's value")
        neighbours = np.all((draws >= np.floor(v * s) / s - 1e-12) & (draws <= np.ceil(v * s) / s + 1e-12))
        if not neighbours:
            fail(f"stochastic_round(v, {s}, rng): a value moved past its two neighbouring levels", "floor or ceil",
                 "further", "only the level just below or just above v may come out")
        mean = draws.mean(axis=0)
        if np.any(np.abs(mean - v) > 0.05 / s + 0.01):
            i = int(np.argmax(np.abs(mean - v)))
            fail(f"stochastic_round: the mean over 4000 draws of v={v[i]} with {s} levels", v[i], round(mean[i], 3),
                 "round up with probability v*levels - floor(v*levels): then the mean is v (unbiased)")
    # one draw shared by every entry is unbiased too, but it rounds a whole vector up or down together, and the
    # variance of a sum of entries (what the all-reduce adds up) then grows like n squared instead of n
    halves = np.asarray(fn(np.full(1000, 0.5), 1, np.random.default_rng(0)), float)
    if not 0.4 <= halves.mean() <= 0.6:
        fail("stochastic_round(1000 entries of 0.5, 1 level, rng): share rounded up", "about half",
             f"{halves.mean():.0%}", "draw one random number per entry (rng.random(v.shape)), not one for the vector")
    passed("stochastic_round: on the levels, between the neighbours, unbiased, independent per entry")


def _topk_ef(grad, residual, k):
    acc = grad + residual
    idx = np.argpartition(np.abs(acc), acc.size - k)[acc.size - k:]
    sent = np.zeros_like(acc)
    sent[idx] = acc[idx]
    return sent, acc - sent


def check_topk_feedback(fn: Callable[[np.ndarray, np.ndarray, int], tuple]) -> None:
    """``fn(grad, residual, k) -> (sent, new_residual)``: the k largest entries of grad + residual, and the rest."""
    rng = np.random.default_rng(0)
    for n, k in ((10, 1), (50, 5), (200, 2)):
        g, r = rng.standard_normal(n), rng.standard_normal(n) * 0.5
        shown = f"topk_feedback(grad of shape ({n},), residual, k={k})"
        got = attempt("topk_feedback", fn, g.copy(), r.copy(), k, shown=shown)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            fail(shown, "(what is sent, the new residual)", got, "return a pair: the sparse gradient, shaped like "
                 "grad, and the new residual")
        want_sent, want_res = _topk_ef(g, r, k)
        sent, res = np.asarray(got[0], float), np.asarray(got[1], float)
        if sent.shape != g.shape or res.shape != g.shape:
            fail(f"{shown}: the shapes of what is sent and of the residual", (g.shape, g.shape),
                 (sent.shape, res.shape), "both are shaped like grad: what is sent is zero except at the k entries "
                 "kept (their positions say which)")
        if np.count_nonzero(sent) != k:
            fail(f"topk_feedback(grad, residual, k={k}): entries sent", k, int(np.count_nonzero(sent)),
                 "send exactly k entries, zeros elsewhere")
        if not np.allclose(sent, want_sent):
            acc = g + r
            by_value = np.zeros_like(acc)
            top = np.argsort(acc)[-k:]
            by_value[top] = acc[top]
            if np.allclose(sent, _topk_ef(g, 0 * r, k)[0]):
                hint = "pick the top k of grad + residual, the gradient with what earlier steps held back"
            elif np.allclose(sent, by_value):
                hint = "the largest in magnitude: np.abs(...), a large negative entry matters as much"
            else:
                hint = "send the k entries of grad + residual largest in magnitude, with their values"
            fail(f"topk_feedback(grad, residual, k={k}): what is sent", want_sent[want_sent != 0].round(4),
                 sent[sent != 0].round(4), hint)
        if not np.allclose(sent + res, g + r):
            fail(f"topk_feedback(grad, residual, k={k}): sent + new residual", "grad + residual", "something else",
                 "the new residual is everything not sent: nothing may be lost, only delayed")
    passed("topk_feedback: the top k sent, the rest kept")


def check_powersgd_bytes(fn: Callable[[int, int, int, int], float]) -> None:
    """``fn(m, n, rank, itemsize)``: bytes of the two matrices PowerSGD sends for an m x n gradient."""
    cases = [((m, n, r, e), r * (m + n) * e, "P is m x r and Q is n x r") for m, n, r, e in
             ((1024, 4096, 4, 2), (768, 768, 1, 4), (12288, 49152, 8, 2), (10, 3, 2, 8))]

    def diagnose(args, expected, got):
        m, n, r, e = args
        if np.isclose(got, m * n * e):
            return "that is the dense matrix; PowerSGD sends its two thin factors"
        if np.isclose(got, r * m * n * e / max(m, n)) or np.isclose(got, r * (m + n)):
            return "count both factors, each in bytes: (m + n) x rank x itemsize"
        return None

    check_cases("powersgd_bytes", fn, cases, rel=1e-12, diagnose=diagnose)
