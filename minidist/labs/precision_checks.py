"""Checks for lab 21, reduced precision (book chapter 30): a format's largest number, rounding to nearest
even with subnormals, and the dynamic loss-scaling rule, each against ``md.precision``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from minidist.labs.check import attempt, check_cases, fail, passed
from minidist.precision import FORMATS, Format, cast, representable


def check_max_finite(fn: Callable[[int, int, bool], float]) -> None:
    """``fn(exponent_bits, mantissa_bits, ieee)``: the largest finite number of the format."""
    shapes = [(8, 23, True), (8, 7, True), (5, 10, True), (4, 3, False), (5, 2, True), (4, 3, True), (3, 2, True),
              (5, 2, False), (6, 9, True)]
    cases = [((e, m, ieee), Format("f", e, m, ieee).max, "all mantissa bits set, at the largest exponent")
             for e, m, ieee in shapes]

    def diagnose(args, expected, got):
        e, m, ieee = args
        bias = 2 ** (e - 1) - 1
        if not ieee and np.isclose(got, (2 - 2.0**-m) * 2.0 ** (2**e - 1 - bias)):
            return "E4M3 keeps the all-ones exponent for numbers but spends S.1111.111 on NaN: drop that last pattern"
        if not ieee and np.isclose(got, (2 - 2.0**-m) * 2.0 ** (2**e - 2 - bias)):
            return "without infinities the all-ones exponent holds numbers too (only its top mantissa is NaN)"
        if np.isclose(got, 2.0 ** (2**e - 2 - bias)) or np.isclose(got, 2.0 ** (2**e - 1 - bias)):
            return "the largest number has every mantissa bit set: (2 - 2^-m) x 2^emax, not just 2^emax"
        if np.isclose(got, (2 - 2.0**-m) * 2.0 ** (2**e - 1 - bias)):
            return "IEEE formats reserve the all-ones exponent for infinities and NaN: emax = 2^e - 2 - bias"
        return None

    check_cases("max_finite", fn, cases, rel=1e-12, diagnose=diagnose)


def check_round_to(fn: Callable[[np.ndarray, int, int], np.ndarray]) -> None:
    """``fn(x, mantissa_bits, min_exponent)``: ``x`` rounded to the nearest number with that many mantissa bits
    (ties to even), subnormals below ``2^min_exponent``; overflow is not asked for."""
    rng = np.random.default_rng(0)
    for name in ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2"):
        f = FORMATS[name]
        v = representable(f) if f.bits <= 16 else np.zeros(0)
        v = v[~np.signbit(v) & (v < f.max)]  # one zero: -0.0 and +0.0 would make 0.0 look like a tie
        mids = (v[:-1] + v[1:]) / 2
        wide = rng.standard_normal(2000) * np.exp2(rng.integers(f.min_exponent - f.mantissa_bits - 1,
                                                                f.max_exponent, 2000))
        x = np.concatenate([v[:4000], mids[:4000], -mids[:4000], wide[np.abs(wide) < f.max]])
        want = cast(x, f)
        got = attempt("round_to", fn, x.copy(), f.mantissa_bits, f.min_exponent,
                      shown=f"round_to(x of shape {x.shape}, {f.mantissa_bits}, {f.min_exponent}) ({name})")
        got = np.asarray(got, dtype=np.float64)
        if got.shape != x.shape:
            fail(f"round_to(x of shape {x.shape}, {f.mantissa_bits}, {f.min_exponent}) ({name})", x.shape, got.shape,
                 "round elementwise: the result has the shape of x")
        # A zero's sign is not asked for: sign(x) x round(|x| / q) x q is as right as round(x / q) x q.
        bad = np.flatnonzero(~((got == want) & ((want == 0) | (np.signbit(got) == np.signbit(want)))))
        if len(bad):
            i = bad[0]
            tie = bool(np.isin(abs(x[i]), mids))
            neighbour = abs(abs(got[i] - want[i]) - 2 * abs(x[i] - want[i])) <= 1e-300  # the other side of a tie
            sub = abs(x[i]) < 2.0**f.min_exponent
            hint = ("a tie goes to the neighbour whose last mantissa bit is 0: np.round rounds halves to even, "
                    "np.floor(x + 0.5) does not" if tie and neighbour else
                    "below 2^min_exponent the spacing stays 2^(min_exponent - mantissa_bits): clamp the exponent"
                    if sub else "the spacing in the binade of x is 2^(floor(log2|x|) - mantissa_bits)")
            fail(f"round_to({float(x[i])!r}, {f.mantissa_bits}, {f.min_exponent}) ({name}, {len(bad)} of {len(x)} "
                 "wrong)",
                 float(want[i]), float(got[i]), hint)
    passed("round_to: fp16, bf16, E4M3 and E5M2, every tie included")


def _scaler(scale: float, found_inf: bool, clean: int, growth_interval: int) -> tuple[float, int, bool]:
    if found_inf:
        return scale / 2, 0, False
    clean += 1
    if clean == growth_interval:
        return scale * 2, 0, True
    return scale, clean, True


def check_loss_scale_update(fn: Callable[[float, bool, int, int], tuple]) -> None:
    """``fn(scale, found_inf, clean_steps, growth_interval) -> (scale, clean_steps, step)``."""
    cases = [(2.0**16, False, 0, 3), (2.0**16, False, 1, 3), (2.0**16, False, 2, 3), (2.0**16, True, 2, 3),
             (2.0**10, True, 0, 1000), (1.0, False, 999, 1000), (8.0, False, 0, 1)]
    for args in cases:
        want = _scaler(*args)
        got = attempt("loss_scale_update", fn, *args)
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            fail(f"loss_scale_update{args}", want, got, "return the tuple (scale, clean_steps, step)")
        if tuple(got) != want:
            scale, inf, clean, n = args
            if inf:
                hint = "an overflow halves the scale, restarts the count of clean steps, and skips the update"
            elif got[2] is False:
                hint = "a step without overflow is taken"
            else:
                hint = f"after {n} clean steps in a row the scale doubles and the count starts again"
            fail(f"loss_scale_update{args}", want, got, hint)
    passed(f"loss_scale_update: {len(cases)} cases")
