"""bf16, fp16 and fp8 emulated bit for bit: every pattern decoded, every value and every tie rounded, checked
against the published definitions, numpy's IEEE float16 and ml_dtypes (the bfloat16/float8 dtypes JAX uses)."""

from __future__ import annotations

import numpy as np
import pytest

from minidist import precision as P

ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes (the test extra) is the fp8/bf16 reference")

REFERENCE = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
             "fp8_e5m2": ml_dtypes.float8_e5m2}
UINT = {8: np.uint8, 16: np.uint16}


def same(a, b) -> bool:
    """Bitwise equal as float64: the same numbers, the same signs of zero, NaN where the other has NaN."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return bool(np.array_equal(a.view(np.int64), b.view(np.int64)) or
                (np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(a[~np.isnan(a)], b[~np.isnan(b)])
                 and np.array_equal(np.signbit(a[~np.isnan(a)]), np.signbit(b[~np.isnan(b)]))))


@pytest.mark.parametrize("name,max_,normal,subnormal", [
    ("fp8_e4m3", 448.0, 2.0**-6, 2.0**-9),           # OCP OFP8 specification, table 1
    ("fp8_e5m2", 57344.0, 2.0**-14, 2.0**-16),
    ("fp16", 65504.0, 2.0**-14, 2.0**-24),           # IEEE 754 binary16
    ("bf16", (2 - 2**-7) * 2.0**127, 2.0**-126, 2.0**-133),
])
def test_published_limits(name, max_, normal, subnormal):
    f = P.format_of(name)
    assert (f.max, f.smallest_normal, f.smallest_subnormal) == (max_, normal, subnormal)
    assert P.representable(f)[-1] == max_
    assert P.representable(f)[P.representable(f) > 0][0] == subnormal


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_every_bit_pattern_decodes_like_the_reference(name):
    f = P.format_of(name)
    bits = np.arange(2**f.bits)
    with np.errstate(invalid="ignore"):
        ref = bits.astype(UINT[f.bits]).view(REFERENCE[name]).astype(np.float64)
    assert same(P.decode(bits, f), ref)
    finite_or_inf = ~np.isnan(ref)
    assert np.array_equal(P.encode(ref[finite_or_inf], f), bits[finite_or_inf])


def _probes(f: P.Format) -> np.ndarray:
    """Every number of the format, every midpoint between neighbours (the ties), one float32 step either side
    of each midpoint, past the largest number, and the special values; both signs."""
    v = P.representable(f)
    v = v[v >= 0]
    mids = (v[:-1] + v[1:]) / 2
    top = np.array([f.max * (1 + f.eps / 2), f.max * (1 + f.eps / 4), f.max * 1.5, f.max * 4, 1e38])
    with np.errstate(over="ignore"):
        x = np.concatenate([v, mids, top]).astype(np.float32)
    x = np.concatenate([x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(0)),
                        np.array([np.inf, np.nan], np.float32)])
    return np.concatenate([x, -x])


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_every_value_and_every_tie_rounds_like_the_reference(name):
    f = P.format_of(name)
    x = _probes(f)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = x.astype(REFERENCE[name]).astype(np.float64)
    got = P.cast(x, f, dtype=np.float64)
    bad = ~((got == ref) & (np.signbit(got) == np.signbit(ref)) | np.isnan(got) & np.isnan(ref))
    assert not bad.any(), f"{name}: {x[bad][:5]} -> {got[bad][:5]}, reference {ref[bad][:5]}"


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_random_float32_rounds_like_the_reference(name):
    rng = np.random.default_rng(0)
    f = P.format_of(name)
    with np.errstate(over="ignore", invalid="ignore"):
        x = (rng.standard_normal(200_000) * np.exp2(rng.integers(f.min_exponent - f.mantissa_bits - 2,
                                                                 f.max_exponent + 2, 200_000))).astype(np.float32)
        ref = x.astype(REFERENCE[name]).astype(np.float64)
    assert same(P.cast(x, f, dtype=np.float64), ref)


def test_ties_go_to_the_even_neighbour_and_overflow_follows_the_format():
    assert P.cast(464.0, "fp8_e4m3") == 448.0  # between 448 (1.110) and 480 (1.111, the NaN pattern's value)
    assert np.isnan(P.cast(470.0, "fp8_e4m3"))  # E4M3 has no infinity
    assert np.isnan(P.cast(np.inf, "fp8_e4m3"))
    assert P.cast(61440.0, "fp8_e5m2") == np.inf  # the tie above 57344 rounds to the even 2^16: overflow
    assert P.cast(65519.0, "fp16") == 65504.0 and P.cast(65520.0, "fp16") == np.inf
    assert P.cast(2.0**-10, "fp8_e4m3") == 0.0 and P.cast(1.5 * 2.0**-9, "fp8_e4m3") == 2.0**-8
    assert np.signbit(P.cast(-1e-30, "fp16"))  # underflow keeps the sign of zero
    assert P.cast(1e6, "fp8_e4m3", saturate=True) == 448.0 and P.cast(-np.inf, "fp8_e5m2", saturate=True) == -57344.0


def test_fp32_and_dtypes():
    x = np.float32(1.1)
    assert P.cast(x, "fp32") == x and P.cast(x, "bf16").dtype == np.float32
    assert P.cast(1.1, "bf16") == 1 + 13 / 128 and P.cast([1, 2], "fp16").dtype == np.float64


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="unknown format 'fp4'"):
        P.cast(1.0, "fp4")
    with pytest.raises(ValueError, match="not fp8_e4m3 numbers; cast them first"):
        P.encode([1.1], "fp8_e4m3")
    with pytest.raises(ValueError, match="bit patterns are 0 .. 255"):
        P.decode([256], "fp8_e5m2")
    with pytest.raises(ValueError, match="only formats of <= 16 bits"):
        P.representable("fp32")
