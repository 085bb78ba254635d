"""Checks for lab 08, data parallelism (book chapter 14).

The partitioning theorem is checked on simulated ranks: the learner's data-parallel gradient, from
uneven shards of a least-squares batch, must equal the single-device gradient on every rank. A
wrong result is matched against the usual mistakes (no all-reduce, an unweighted mean of the shard
gradients, a plain sum) so the hint names the one that was made. The cost side (buckets, when data
parallelism stops paying) is checked against closed forms.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from minidist import dist
from minidist.labs.check import attempt, check_cases, close, fail, learner_name, number, passed
from minidist.labs.ranks import compare_ranks, run_ranks

GLOBAL_BATCH = 10  # splits evenly over 1, 2 and 5 ranks, unevenly over 3 and 4


def _problem(n: int = GLOBAL_BATCH, d: int = 3):
    rng = np.random.default_rng(8)
    return rng.normal(size=d), rng.normal(size=(n, d)), rng.normal(size=n)


def least_squares_grad(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Gradient of mean((x w - y)^2) over the rows of x: the single-device oracle."""
    return 2.0 * x.T @ (x @ w - y) / len(y)


def _run_dp(fn):
    r, p = dist.get_rank(), dist.get_world_size()
    w, x, y = _problem()
    xs, ys = np.array_split(x, p), np.array_split(y, p)
    out = fn(w.copy(), xs[r].copy(), ys[r].copy(), len(y))
    return None if out is None else np.asarray(getattr(out, "data", out), dtype=np.float64)


def check_dp_gradient(fn: Callable[[np.ndarray, np.ndarray, np.ndarray, int], np.ndarray]) -> None:
    """``fn(w, x_shard, y_shard, global_batch)`` on every rank returns the full-batch gradient of
    mean((x w - y)^2), computed from this rank's shard and one all-reduce."""
    w, x, y = _problem()
    want = least_squares_grad(w, x, y)
    for p in (1, 2, 3, 4):
        xs, ys = np.array_split(x, p), np.array_split(y, p)
        sizes = [len(s) for s in ys]
        local = [least_squares_grad(w, a, b) for a, b in zip(xs, ys)]
        wrong = {
            "no_reduce": [g * n / len(y) for g, n in zip(local, sizes)],
            "no_reduce_mean": local,
            "sum": [sum(local)] * p,
            "equal_mean": [sum(local) / p] * p,
            "sum_loss": [sum(g * n for g, n in zip(local, sizes))] * p,
        }

        def diagnose(rank, got, _want, wrong=wrong, sizes=sizes, p=p):
            if np.allclose(got, wrong["no_reduce"][rank]) or np.allclose(got, wrong["no_reduce_mean"][rank]):
                return ("this is only the rank's own shard's contribution: sum the scaled shard gradients over "
                        "the ranks with md.dist.all_reduce")
            if np.allclose(got, wrong["equal_mean"][rank]):
                return (f"an equal average of the shard gradients is right only when the shards are equal; here "
                        f"they hold {sizes} rows, so weight each shard's mean gradient by |B_i| / |B| before summing")
            if np.allclose(got, wrong["sum"][rank]):
                return (f"that is the sum of the {p} shard means, {p} times too big: weight each shard's mean "
                        "gradient by |B_i| / |B|")
            if np.allclose(got, wrong["sum_loss"][rank]):
                return "you summed the squared errors without dividing by the global batch size"
            return None

        res = run_ranks("dp_gradient", _run_dp, p, args=(fn,),
                        hint="use md.tensor / autograd (or numpy) on the local shard, then md.dist.all_reduce")
        compare_ranks("dp_gradient", list(res), [want] * p,
                      context=f"on {p} ranks (shards of {[len(s) for s in ys]} rows)", diagnose=diagnose,
                      hint="scale the local mean loss by len(y_shard) / global_batch, backpropagate, all-reduce "
                           "the gradient", rtol=1e-10)
    passed("dp_gradient equals the single-device gradient on 1-4 ranks, even and uneven shards")


def check_bucketed_time(fn: Callable[[float, int, int, float, float], float]) -> None:
    """``fn(total_bytes, k, p, alpha, beta)``: k ring all-reduces of total/k bytes each, one after another."""
    from minidist.estimate import collective_time

    def ref(n, k, p, a, b):
        return k * collective_time("all_reduce", n / k, p, a, b, "ring")

    cases = [((1e9, 1, 64, 5e-6, 50e9), ref(1e9, 1, 64, 5e-6, 50e9), "one bucket is one ring all-reduce"),
             ((1e9, 40, 64, 5e-6, 50e9), ref(1e9, 40, 64, 5e-6, 50e9),
              "k all-reduces of n/k bytes: the bandwidth term stays, the latency term is paid k times"),
             ((1e9, 1000, 8, 1e-5, 100e9), ref(1e9, 1000, 8, 1e-5, 100e9), "1000 buckets of 1 MB"),
             ((4e6, 7, 2, 1e-7, 5e10), ref(4e6, 7, 2, 1e-7, 5e10), "two ranks")]

    def diagnose(args, _want, got):
        n, k, p, a, b = args
        if math.isclose(got, collective_time("all_reduce", n, p, a, b, "ring"), rel_tol=1e-9):
            return "each of the k all-reduces pays its own latency 2(p-1) alpha"
        if math.isclose(got, k * collective_time("all_reduce", n, p, a, b, "ring"), rel_tol=1e-9):
            return "each bucket carries n/k bytes, not the whole gradient"
        if math.isclose(got, ref(n, k, p, a, b) / 2, rel_tol=1e-9):
            return "an all-reduce is a reduce-scatter then an all-gather: 2(p-1) steps, not p-1"
        for factor, unit in ((1e3, "milliseconds"), (1e6, "microseconds")):
            if math.isclose(got, _want * factor, rel_tol=1e-6):
                return f"return seconds, not {unit}"
        return None

    check_cases("bucketed_time", fn, cases, diagnose=diagnose)


def check_dp_min_tokens(fn: Callable[[float, float, float], float]) -> None:
    """``fn(peak_flops, beta, bytes_per_grad)``: tokens per GPU at which compute time equals the all-reduce time."""

    def ref(f, b, s):
        return f * s / (3 * b)

    cases = [((312e12, 25e9, 4), ref(312e12, 25e9, 4), "A100, fp32 gradients"),
             ((989e12, 900e9, 2), ref(989e12, 900e9, 2), "H100 over NVLink, bf16 gradients"),
             ((989e12, 50e9, 2), ref(989e12, 50e9, 2), "H100 over InfiniBand")]

    def diagnose(args, want, got):
        f, b, s = args
        if math.isclose(got, b / (f * s) * 3, rel_tol=1e-9) or math.isclose(got, 1 / want, rel_tol=1e-9):
            return "upside down: a faster network (larger beta) must make the threshold smaller"
        if math.isclose(got, want * 3, rel_tol=1e-9):
            return "a training step costs 6 Psi FLOPs per token (forward 2, backward 4), not 2 Psi"
        if math.isclose(got, want / 2, rel_tol=1e-9) or math.isclose(got, want * 2, rel_tol=1e-9):
            return "a ring all-reduce sends about 2 Psi s bytes per GPU (reduce-scatter + all-gather)"
        if math.isclose(got, want / s, rel_tol=1e-9):
            return "the gradient bytes are Psi times bytes_per_grad"
        if math.isclose(got, want * 1.5, rel_tol=1e-9):
            return ("that is F s / (2 beta), where the backward alone (4 Psi per token) hides the all-reduce; R = 1 "
                    "compares it with the whole step, 6 Psi per token")
        return None

    check_cases("dp_min_tokens", fn, cases, rel=1e-6, diagnose=diagnose)



def _ring(n: float, p: int, alpha: float, beta: float) -> float:
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / beta


def _exposed(ready, sizes, bucket_bytes, p, alpha, beta, *, serial=True, overlap=True, minus_end=True) -> float:
    """The reference (and, with a flag off, a usual mistake): comm time left after the last gradient is ready."""
    free = 0.0 if overlap else max(ready)
    filled, last = 0.0, 0.0
    buckets = []
    for t, n in zip(ready, sizes):
        filled, last = filled + n, t
        if filled >= bucket_bytes:
            buckets.append((last, filled))
            filled = 0.0
    if filled:
        buckets.append((last, filled))
    end = 0.0
    for t, n in buckets:
        start = max(t, free) if serial or not overlap else t
        free = start + _ring(n, p, alpha, beta)
        end = max(end, free)
    return end - max(ready) if minus_end else end


def check_exposed_comm(fn: Callable) -> None:
    """``fn(ready, sizes, bucket_bytes, p, alpha, beta)``: the all-reduce time left exposed after the backward."""
    rng = np.random.default_rng(14)
    cases = []
    for n_params, cap, p, alpha, beta in [(6, 1e12, 4, 1e-6, 1e10), (6, 1.0, 4, 1e-6, 1e10), (12, 3e5, 8, 5e-6, 2e10),
                                          (20, 8e5, 2, 1e-5, 5e9), (9, 2e5, 16, 2e-6, 1e11), (30, 1e6, 64, 5e-6, 5e10)]:
        ready = np.cumsum(rng.uniform(1e-5, 1e-4, size=n_params))
        sizes = rng.integers(50_000, 400_000, size=n_params).astype(float)
        cases.append((ready, sizes, cap, p, alpha, beta))
    name = learner_name(fn, "exposed_comm")
    for ready, sizes, cap, p, alpha, beta in cases:
        call = f"{name}(<{len(ready)} gradients>, bucket_bytes={cap:g}, p={p}, alpha={alpha:g}, beta={beta:g})"
        got = number(f"{call}: expected a number",
                     attempt(name, fn, ready.tolist(), sizes.tolist(), cap, p, alpha, beta, shown=call))
        want = _exposed(ready, sizes, cap, p, alpha, beta)
        if close(got, want, rel=1e-9, abs_=1e-15):
            continue
        hint = ("close a bucket when the gradients in it reach bucket_bytes (the last one may be smaller); each "
                "bucket's all-reduce starts when its last gradient is ready and the previous all-reduce is done")
        if close(got, _exposed(ready, sizes, cap, p, alpha, beta, overlap=False)):
            hint = ("that is every all-reduce after the backward: a bucket can start as soon as its last gradient "
                    "exists, while the backward goes on")
        elif close(got, _exposed(ready, sizes, cap, p, alpha, beta, serial=False)):
            hint = "the communication stream runs one all-reduce at a time: a bucket waits for the one before it"
        elif close(got, _exposed(ready, sizes, cap, p, alpha, beta, minus_end=False)):
            hint = "that is when the last all-reduce ends; what is exposed is the part after the backward finished"
        fail(f"{call} is wrong", want, got, hint)
    passed(f"{name}: {len(cases)} backwards, from one bucket per gradient to one bucket for all")
