"""Checks for lab 19, gradient compression (book chapter 28): QSGD's stochastic rounding, top-k with error
feedback, PowerSGD's rank-r round and the time a run takes to reach a target loss, each against a reference on
cases the notebook does not show."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from minidist.labs.check import attempt, close, fail, number, passed


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
                 "round up with the probability that makes the mean come out at v, unbiased: the closer v sits to the "
                 "level above, the likelier it goes up")
    # one draw shared by every entry is unbiased too, but it rounds a whole vector up or down together, and the
    # variance of a sum of entries (what the all-reduce adds up) then grows like n squared instead of n
    halves = np.asarray(fn(np.full(1000, 0.5), 1, np.random.default_rng(0)), float)
    if not 0.4 <= halves.mean() <= 0.6:
        fail("stochastic_round(1000 entries of 0.5, 1 level, rng): share rounded up", "about half",
             f"{halves.mean():.0%}", "draw one random number per entry, not one for the whole vector")
    passed("stochastic_round: on the levels, between the neighbours, unbiased, independent per entry")


def _topk_ef(grad, residual, k):
    acc = grad + residual
    idx = np.argpartition(np.abs(acc), acc.size - k)[acc.size - k:]
    sent = np.zeros_like(acc)
    sent[idx] = acc[idx]
    return sent, acc - sent


def _top(values: np.ndarray, k: int) -> set[int]:
    return {int(i) for i in np.argsort(values)[-k:]}


def _topk_cases():
    """Cases where the usual slips choose different entries: by |grad| alone, by signed value, by magnitude."""
    rng = np.random.default_rng(2028)
    for n, k in ((10, 1), (50, 5), (200, 2), (64, 8)):
        while True:
            g, r = rng.standard_normal(n), rng.standard_normal(n)
            acc = g + r
            right = _top(np.abs(acc), k)
            if right != _top(np.abs(g), k) and right != _top(acc, k):
                yield g, r, k
                break


def check_topk_feedback(fn: Callable[[np.ndarray, np.ndarray, int], tuple]) -> None:
    """``fn(grad, residual, k) -> (sent, new_residual)``: the k largest entries of grad + residual, and the rest."""
    for g, r, k in _topk_cases():
        n = g.size
        shown = f"topk_feedback(grad of shape ({n},), residual, k={k})"
        got = attempt("topk_feedback", fn, g.copy(), r.copy(), k, shown=shown)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            fail(shown, "(what is sent, the new residual)", got, "return a pair: the sparse gradient, shaped like "
                 "grad, and the new residual")
        want_sent, _ = _topk_ef(g, r, k)
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
            chosen = {int(i) for i in np.flatnonzero(sent)}
            if chosen == _top(np.abs(g), k):
                hint = ("these are the largest entries of this step's gradient alone; the residual is part of "
                        "what competes for a place: what earlier steps held back must get its turn")
            elif chosen == _top(np.abs(acc), k):
                hint = ("the right entries, the wrong values: send what was accumulated there (this step's gradient "
                        "with what was held back), not the gradient alone")
            elif chosen in (_top(acc, k), _top(-acc, k)):
                hint = "the largest in magnitude: a large negative entry matters as much as a large positive one"
            else:
                hint = "send the k entries of grad + residual largest in magnitude, with their values"
            fail(f"topk_feedback(grad, residual, k={k}): what is sent", want_sent[want_sent != 0].round(4),
                 sent[sent != 0].round(4), hint)
        if not np.allclose(sent + res, g + r):
            fail(f"topk_feedback(grad, residual, k={k}): sent + new residual", "grad + residual", "something else",
                 "the new residual is everything not sent: nothing may be lost, only delayed")
    passed("topk_feedback: the top k sent, the rest kept")


def _powersgd(grads: list[np.ndarray], q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = np.linalg.qr(sum(g @ q for g in grads))[0]
    q = sum(g.T @ p for g in grads)
    return p @ q.T, q


def _same_columns_up_to_sign(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    return all(np.allclose(a[:, j], b[:, j]) or np.allclose(a[:, j], -b[:, j]) for j in range(a.shape[1]))


def _powersgd_diagnosis(grads, q, approx, new_q) -> str:
    """Name the slip that reproduces ``approx``, or a generic pointer."""
    p_sum = sum(g @ q for g in grads)
    raw = p_sum @ sum(g.T @ p_sum for g in grads).T  # no orthonormal basis
    want, _ = _powersgd(grads, q)
    if np.allclose(approx, raw):
        return ("the projections are only coordinates when the basis is orthonormal: make the summed P's columns "
                "orthonormal before the second projection")
    if np.allclose(approx * len(grads), want):
        return "the all-reduce adds the replicas' pieces (the gradients are already scaled): a sum, not a mean"
    p_hat = np.linalg.qr(p_sum)[0]
    if any(np.allclose(approx, p_hat @ (g.T @ p_hat).T) for g in grads):
        return "the second projection is summed over the replicas too: every replica ends with the same result"
    own = sum(np.linalg.qr(g @ q)[0] @ (g.T @ np.linalg.qr(g @ q)[0]).T for g in grads)
    if np.allclose(approx, own):
        return ("the replicas must share one basis: sum their first projections before orthonormalising, or each "
                "projects onto a basis of its own and the pieces cannot be added")
    return "two projections, each summed over the replicas, with an orthonormal basis in between"


def check_powersgd_step(fn: Callable[[list[np.ndarray], np.ndarray], tuple]) -> None:
    """``fn(grads, q) -> (approx, new_q)``: one PowerSGD round on the replicas' m x n gradients with the shared
    n x r basis q, against a reference on fresh matrices (several shapes, ranks and replica counts)."""
    rng = np.random.default_rng(19)
    for m, n, r, p in ((6, 4, 1, 2), (12, 7, 2, 3), (9, 16, 3, 4), (20, 20, 4, 2)):
        base = rng.standard_normal((m, 2 * r)) @ rng.standard_normal((2 * r, n))  # a shared low-rank direction
        grads = [base + 0.3 * rng.standard_normal((m, n)) for _ in range(p)]
        q = rng.standard_normal((n, r))
        shown = f"powersgd_step({p} gradients of shape ({m}, {n}), q of shape ({n}, {r}))"
        out = attempt("powersgd_step", fn, [g.copy() for g in grads], q.copy(), shown=shown)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            fail(shown, "(the approximation, the new basis)", out,
                 "return a pair: the rank-r approximation (m x n) and the new basis (n x r)")
        approx, new_q = np.asarray(out[0], float), np.asarray(out[1], float)
        want, want_q = _powersgd(grads, q)
        if approx.shape != (m, n) or new_q.shape != (n, r):
            fail(f"{shown}: the shapes returned", ((m, n), (n, r)), (approx.shape, new_q.shape),
                 "the approximation is shaped like one gradient, m x n; the new basis like q, n x r")
        if not np.allclose(approx, want):
            fail(f"{shown}: the approximation", want.round(3)[0], approx.round(3)[0],
                 _powersgd_diagnosis(grads, q, approx, new_q))
        if _same_columns_up_to_sign(new_q, q) and not _same_columns_up_to_sign(q, want_q):
            fail(f"{shown}: the new basis", want_q.round(3)[0], new_q.round(3)[0],
                 "return the new basis the second projection gave, not the old one: the next step starts from it "
                 "(warm start)")
        if not _same_columns_up_to_sign(new_q, want_q):
            fail(f"{shown}: the new basis", want_q.round(3)[0], new_q.round(3)[0],
                 "the new basis is the second projection, summed over the replicas")
    passed("powersgd_step: two summed projections around an orthonormal basis, on 4 fresh cases")


def _time_to_target(losses, step_times, target, window):
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    hit = np.flatnonzero(smooth <= target)
    return math.inf if hit.size == 0 else float(np.cumsum(step_times)[hit[0] + window - 1])


def _curves():
    """Noisy falling loss curves with uneven step times, some never reaching their target."""
    rng = np.random.default_rng(2019)
    for steps, window, reach in ((60, 5, True), (200, 10, True), (120, 8, False), (90, 1, True), (150, 12, True)):
        s = np.arange(steps)
        losses = 2 + 1.5 * np.exp(-s / (steps / 3)) + 0.25 * rng.standard_normal(steps)
        times = rng.uniform(0.5e-3, 2e-3, steps)
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        target = float(np.quantile(smooth, 0.3)) if reach else float(smooth.min() - 0.05)
        yield list(losses), list(times), round(target, 4), window


def _time_diagnosis(losses, times, target, window, got) -> str | None:
    c = np.cumsum(times)
    raw = np.flatnonzero(np.asarray(losses) <= target)
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    hit = np.flatnonzero(smooth <= target)
    if window > 1 and raw.size and close(got, c[raw[0]]):
        return ("one lucky batch is not the target reached: a training loss is noisy, so judge the mean of the "
                f"last {window} steps' losses")
    if hit.size == 0:
        return None
    i = hit[0]
    if close(got, c[i]) and window > 1:
        return ("the mean of a window is known only once its last step has run: count the time up to the last "
                "step of the first window below the target")
    if close(got, c[i + window - 1] - times[i + window - 1]):
        return "count the time up to the end of that step, its own duration included"
    if close(got, i + window) or close(got, i + window - 1):
        return "that is a step count; the answer is simulated seconds, the durations of the steps run so far"
    if close(got, (i + window) * float(np.mean(times))):
        return "steps have different durations: add up the ones that ran, not the mean step time"
    return None


def check_time_to_target(fn: Callable[[list, list, float, int], float]) -> None:
    """``fn(losses, step_times, target, window)``: simulated seconds until the mean of the last ``window`` losses
    first reaches ``target`` (at or below), the durations of every step run so far; infinity if it never does."""
    n = 0
    for losses, times, target, window in _curves():
        shown = f"time_to_target({len(losses)} losses, {len(times)} step times, target={target}, window={window})"
        got = attempt("time_to_target", fn, list(losses), list(times), target, window, shown=shown)
        want = _time_to_target(losses, times, target, window)
        if math.isinf(want):
            if got is None or not (isinstance(got, (int, float, np.floating)) and math.isinf(got) and got > 0):
                first = np.flatnonzero(np.asarray(losses) <= target)
                lucky = window > 1 and first.size and isinstance(got, (int, float, np.floating)) and \
                    close(got, np.cumsum(times)[first[0]])
                fail(f"{shown}: a run that never gets there", math.inf, got,
                     "one lucky batch is not the target reached: a training loss is noisy, so judge the mean of the "
                     f"last {window} steps' losses" if lucky else
                     "a run that never reaches the target takes forever: return infinity (math.inf), so that "
                     "comparing and sorting times still works")
            n += 1
            continue
        got = number(f"{shown}: expected a number of seconds", got)
        if not close(got, want, rel=1e-9):
            fail(f"{shown} is wrong", want, got, _time_diagnosis(losses, times, target, window, got)
                 or "the first step where the mean of the last `window` losses is at or below the target; the "
                    "time is the sum of the durations of the steps up to it")
        n += 1
    passed(f"time_to_target: {n} runs, one that never gets there")
