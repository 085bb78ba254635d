"""Checks for lab 03, economics and estimation."""

from __future__ import annotations

import math
from collections.abc import Callable

from minidist.labs.check import attempt, check_cases, fail, learner_name, number, numbers_of, passed


def check_approx_params(fn: Callable[[int, int, int], float]) -> None:
    """``fn(layers, hidden, vocab)`` = 12 L h^2 + 2 V h."""

    def diagnose(args, expected, got):
        L, h, V = args
        if math.isclose(got, 12 * L * h * h, rel_tol=1e-9):
            return "you left out the embeddings: 2 V h (input embedding and output projection)"
        if math.isclose(got, 12 * L * h * h + V * h, rel_tol=1e-9):
            return "untied embeddings count twice: V h in, V h out"
        if math.isclose(got, 4 * L * h * h + 2 * V * h, rel_tol=1e-9) or math.isclose(got, 8 * L * h * h + 2 * V * h):
            return "per layer: 4h^2 for attention (Q, K, V, O) plus 8h^2 for the MLP (h x 4h, 4h x h)"
        return None

    cases = [((48, 7168, 50_000), 12 * 48 * 7168**2 + 2 * 50_000 * 7168, "12 L h^2 + 2 V h"),
             ((96, 12288, 50_257), 12 * 96 * 12288**2 + 2 * 50_257 * 12288, "GPT-3 175B's shape: about 175e9"),
             ((2, 64, 100), 12 * 2 * 64**2 + 2 * 100 * 64, "a tiny model: embeddings matter here")]
    check_cases("approx_params", fn, cases, diagnose=diagnose)


def check_memory_estimates(state_fn: Callable[[float], float], act_fn: Callable) -> None:
    """16 bytes per parameter; L s b h (34 + 5 a s / h) bytes of activations."""
    check_cases("model_state_bytes", state_fn,
                [((1e9,), 16e9, "2 (bf16 weights) + 2 (bf16 grads) + 4 + 4 + 4 (fp32 master, m, v) = 16 bytes"),
                 ((70e9,), 1.12e12, "70B -> 1.12 TB")],
                diagnose=lambda a, e, g: "Adam's m and v are fp32 and so is the master copy" if g in (8 * a[0],
                                                                                                  12 * a[0]) else None)

    def ref(s, b, h, a, L):
        return L * s * b * h * (34 + 5 * a * s / h)

    def diagnose(args, expected, got):
        s, b, h, a, L = args
        if math.isclose(got, L * s * b * h * 34, rel_tol=1e-9):
            return "the attention scores add 5 a s / h per s b h: they grow with s^2"
        if math.isclose(got, expected / L, rel_tol=1e-9):
            return "that is one layer: multiply by the number of layers"
        return None

    check_cases("activation_bytes", act_fn,
                [((4096, 1, 7168, 56, 48), ref(4096, 1, 7168, 56, 48), "s b h (34 + 5 a s / h) per layer"),
                 ((2048, 4, 4096, 32, 32), ref(2048, 4, 4096, 32, 32), "the micro-batch b multiplies everything"),
                 ((128, 2, 64, 4, 2), ref(128, 2, 64, 4, 2), "a tiny model")], diagnose=diagnose)


def check_run_estimate(fn: Callable) -> None:
    """(step seconds, tokens/s, days, dollars) from 6 Psi B / (P F MFU)."""
    args = (30e9, 600e9, 4 * 2**20, 128, 989.4e12, 0.4, 4.0)
    got = attempt("run_estimate", fn, *args)
    psi, tokens, b, p, f, m, usd = args
    step = 6 * psi * b / (p * f * m)
    tps = b / step
    secs = tokens / tps
    want = (step, tps, secs / 86400, p * secs / 3600 * usd)
    names = ("step seconds", "tokens per second", "days", "dollars")
    hints = ("6 Psi B FLOPs shared by P GPUs at F * MFU each",
             "tokens per step divided by seconds per step",
             "tokens / (tokens per second), in days (86400 s)",
             "GPU-hours: gpus * hours, times the price per GPU-hour")
    got = numbers_of(f"run_estimate{args}", got, names)
    # the usual slips, as (field, factor got / want, hint)
    slips = [(0, 1 / 3, "count the backward pass: 6 Psi FLOPs per token (2 forward, 4 backward), not 2 Psi"),
             (0, m, "divide by the MFU too: each GPU delivers only MFU x F of its peak"),
             (0, p, "the P GPUs share the step's FLOPs: divide by P"),
             (2, 24.0, "that is hours: a day is 86400 seconds"),
             (3, 1 / p, "that is the cost of one GPU: GPU-hours are hours times the number of GPUs")]
    for i, (name, w, g, h) in enumerate(zip(names, want, got, hints)):
        if not math.isclose(float(g), w, rel_tol=1e-9):
            h = next((why for j, factor, why in slips if j == i and math.isclose(float(g), w * factor, rel_tol=1e-9)),
                     h)
            fail(f"run_estimate{args}: {name} is wrong", w, g, h)
    # no days or dollars here: the check's case is a round Psi = 30e9, the lab's run the Psi = 12 L h^2 + 2 V h =
    # 30.31e9 it computed, so the check would print 24.7 days, $303,214 just above the lab's 24.9 days, $306,366
    passed("run_estimate: step time, throughput, days and dollars follow 6 Psi B / (P F MFU)")


def check_sandbox_mfu(value: float, n_params: int, tokens: int, seconds: float, peak: float) -> None:
    want = 6 * n_params * tokens / (seconds * peak)
    value = number("sandbox_mfu", value, "sandbox_mfu is one number: the MFU as a fraction (0.5 for 50%)")
    if not math.isclose(value, want, rel_tol=1e-9):
        hint = "MFU = (6 Psi tokens / seconds) / peak: achieved model FLOP/s over the peak"
        if math.isclose(value, want / 3, rel_tol=1e-9):
            hint = "count the backward pass too: 6 Psi per token, not 2 Psi"
        elif math.isclose(value, 100 * want, rel_tol=1e-3):
            hint = "give MFU as a fraction of the peak (0.5 for 50%), not in percent"
        elif math.isclose(value, want, rel_tol=2e-2):
            hint = "close, but rounded: compute it from the numbers, do not type it in"
        fail("sandbox MFU", want, value, hint)
    passed(f"sandbox MFU = {want:.1%}")


def check_measured_gap(measured_mfu: float, gpu_wait: float, *, result, n_params: int, tokens: int,
                       peak: float) -> None:
    """Lab 03's step on the measured device: ``measured_mfu`` is the MFU of rank 0's compute window (``result[0][0]``
    seconds), ``gpu_wait`` the share of that window in which rank 0's GPU runs no kernel (the window less the busy
    time of its compute-stream events, over the window). Both are computed here from ``result`` itself."""
    seconds = float(result[0][0])
    busy = sum(e.end - e.start for e in result.trace.filter(rank=0, stream="compute"))
    want_mfu, want_wait = 6 * n_params * tokens / (seconds * peak), 1 - busy / seconds
    mfu = number("measured_mfu", measured_mfu, "measured_mfu is one number: the MFU as a fraction")
    wait = number("gpu_wait", gpu_wait, "gpu_wait is one number: a share of the step (0.5 for half of it)")
    if not math.isclose(mfu, want_mfu, rel_tol=1e-9):
        hint = "the same MFU formula as sandbox_mfu, on the measured device's compute window"
        if math.isclose(mfu, 100 * want_mfu, rel_tol=1e-3):
            hint = "give MFU as a fraction of the peak, not in percent"
        elif math.isclose(mfu, 6 * n_params * tokens / (busy * peak), rel_tol=1e-9):
            hint = "MFU divides by the whole step, the time the GPU waits included, not by its busy time alone"
        fail("measured MFU", want_mfu, mfu, hint)
    if not math.isclose(wait, want_wait, rel_tol=1e-9, abs_tol=1e-12):
        hint = "the share of the window in which rank 0's compute stream runs nothing: 1 - busy / window"
        if math.isclose(wait, busy / seconds, rel_tol=1e-9):
            hint = "that is the share in which the GPU works; the question asks for the share in which it waits"
        elif math.isclose(wait, 100 * want_wait, rel_tol=1e-3):
            hint = "a share (0.5 for half the step), not a percentage"
        fail("GPU wait share", want_wait, wait, hint)
    passed(f"measured MFU = {want_mfu:.2%}; the GPU waits {want_wait:.0%} of the step")


def _fleet(params, tokens, batch_tokens, options, deadline_days, peak, mfu, price, alpha, beta, *, comm=True,
           deadline=True):
    """The reference: for each GPU count, a step is the compute share plus one ring all-reduce of the bf16
    gradients (not overlapped); the cheapest count that meets the deadline, as (gpus, days, dollars), or None."""
    best = None
    for p in options:
        step = 6 * params * batch_tokens / (p * peak * mfu)
        if comm and p > 1:
            step += 2 * (p - 1) * alpha + 2 * (p - 1) / p * 2 * params / beta
        days = tokens / batch_tokens * step / 86400
        dollars = p * days * 24 * price
        if (days <= deadline_days or not deadline) and (best is None or dollars < best[2]):
            best = (p, days, dollars)
    return best


def check_cheapest_fleet(fn: Callable) -> None:
    """``fn(params, tokens, batch_tokens, options, deadline_days, peak, mfu, price, alpha, beta)``."""
    base = dict(params=30e9, tokens=600e9, batch_tokens=4 * 2**20, peak=989e12, mfu=0.4, price=4.0, alpha=5e-6,
                beta=50e9)
    cases = [dict(base, options=[64, 128, 256, 512, 1024], deadline_days=60.0),
             dict(base, options=[64, 128, 256, 512, 1024], deadline_days=12.0),
             dict(base, options=[64, 128], deadline_days=5.0),  # nothing is fast enough
             dict(base, params=7e9, tokens=1.4e12, options=[8, 32, 128, 512, 2048], deadline_days=20.0, beta=25e9),
             dict(base, params=70e9, tokens=1.4e12, options=[512, 1024, 2048, 4096, 8192], deadline_days=45.0,
                  mfu=0.35, price=2.5),
             dict(base, params=1e9, tokens=2e10, options=[1, 2, 4, 8, 16], deadline_days=3.0, beta=10e9)]
    keys = ("params", "tokens", "batch_tokens", "options", "deadline_days", "peak", "mfu", "price", "alpha", "beta")
    name = learner_name(fn, "cheapest_fleet")
    for case in cases:
        args = tuple(case[k] for k in keys)
        call = (f"{name}(params={case['params']:g}, tokens={case['tokens']:g}, options={case['options']}, "
                f"deadline_days={case['deadline_days']:g}, mfu={case['mfu']}, beta={case['beta']:g})")
        got = attempt(name, fn, *args, shown=call)
        want = _fleet(*args)
        if want is None:
            if got is not None:
                fail(f"{call}: no GPU count meets the deadline", None, got,
                     "when no option finishes in time, return None")
            continue
        if got is None:
            fail(f"{call} returned None", want, None, f"{want[0]} GPUs finish in {want[1]:.1f} days")
        p, days, dollars = numbers_of(call, got, ("gpus", "days", "dollars"))
        if int(p) == want[0] and math.isclose(days, want[1], rel_tol=1e-6) and math.isclose(dollars, want[2],
                                                                                            rel_tol=1e-6):
            continue
        hint = ("for every GPU count: a step's compute share plus one ring all-reduce of the 2-byte gradients, "
                "then days and dollars; keep the cheapest count that finishes by the deadline")
        if _fleet(*args, comm=False) and int(p) == _fleet(*args, comm=False)[0] and \
                math.isclose(days, _fleet(*args, comm=False)[1], rel_tol=1e-6):
            hint = ("without communication every GPU count costs the same GPU-hours: add the gradient all-reduce "
                    "to each step (2 (p-1) alpha + 2 (p-1)/p of the gradient bytes over beta)")
        elif _fleet(*args, deadline=False) and int(p) == _fleet(*args, deadline=False)[0]:
            hint = "that option is the cheapest but finishes too late: only counts that meet the deadline qualify"
        fail(f"{call} is wrong", want, (p, days, dollars), hint)
    passed(f"{name}: {len(cases)} runs, with and without a feasible fleet")
