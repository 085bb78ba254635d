"""Low-precision number formats emulated in numpy: bf16, fp16, fp8 E4M3 and E5M2 (book ch30, lab 21).

Property: a binary floating-point format is fixed by two integers, its exponent and mantissa widths (plus
how it spends its top exponent: on infinities and NaNs, or mostly on more finite numbers). Inside one
binade ``[2^e, 2^(e+1))`` the representable numbers are evenly spaced by ``2^(e - mantissa_bits)``; below the
smallest normal number the spacing stays that of the smallest binade (subnormals). So rounding any real x
to a format is one division by a power of two, a round-half-to-even, and one multiplication - exact in
float64, because every scaling by a power of two is exact there. Overflow and the special values are the
only format-specific part.

Each value is kept in a float32 or float64 array that holds exactly a number of the format: what a GPU
would compute with after the cast, without a dtype of its own. ``encode``/``decode`` give the bit patterns,
so the emulation can be checked against the published definitions bit for bit.

Formats (IEEE 754-2008 for fp16; Google Brain's bfloat16; the OCP 8-bit floating point specification
(OFP8, 2023) for E4M3 and E5M2, the formats of NVIDIA H100 FP8): ``E4M3`` has no infinities and one NaN
pattern per sign (S.1111.111), so its largest number is 1.75 x 2^8 = 448; ``E5M2`` keeps IEEE's
infinities and NaNs and reaches 1.75 x 2^15 = 57,344.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Format:
    """A binary floating-point format: ``exponent_bits``, ``mantissa_bits`` (stored, without the hidden 1),
    and whether the all-ones exponent means infinity/NaN (``ieee``) or, as in E4M3, ordinary numbers except
    the single all-ones pattern, which is NaN."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    ieee: bool = True

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def min_exponent(self) -> int:
        """The exponent of the smallest normal number."""
        return 1 - self.bias

    @property
    def max_exponent(self) -> int:
        top = 2**self.exponent_bits - 1  # the all-ones exponent field
        return (top - 1 if self.ieee else top) - self.bias

    @property
    def max(self) -> float:
        """The largest finite number: all mantissa bits set, except E4M3's NaN pattern."""
        m = self.mantissa_bits
        fraction = 2 - 2.0 ** -m if self.ieee else 2 - 2.0 ** (1 - m)
        return fraction * 2.0**self.max_exponent

    @property
    def smallest_normal(self) -> float:
        return 2.0**self.min_exponent

    @property
    def smallest_subnormal(self) -> float:
        return 2.0 ** (self.min_exponent - self.mantissa_bits)

    @property
    def eps(self) -> float:
        """The gap between 1 and the next number: the relative precision."""
        return 2.0**-self.mantissa_bits


FP32 = Format("fp32", 8, 23)
BF16 = Format("bf16", 8, 7)
FP16 = Format("fp16", 5, 10)
E4M3 = Format("fp8_e4m3", 4, 3, ieee=False)
E5M2 = Format("fp8_e5m2", 5, 2)
FORMATS = {f.name: f for f in (FP32, BF16, FP16, E4M3, E5M2)}


def format_of(fmt: Format | str) -> Format:
    if isinstance(fmt, Format):
        return fmt
    if fmt not in FORMATS:
        raise ValueError(f"precision: unknown format {fmt!r}; known: {sorted(FORMATS)}")
    return FORMATS[fmt]


def cast(x, fmt: Format | str, *, saturate: bool = False, dtype=None) -> np.ndarray:
    """Round ``x`` to the nearest number of ``fmt`` (ties to even), as a float array holding exactly that
    number (``dtype``: float64 by default, or x's float dtype).

    Beyond the largest finite number a value becomes infinity where the format has one and NaN in E4M3
    (the OCP specification's non-saturating conversion); ``saturate=True`` clamps it to +-max instead, as
    fp8 training recipes do. Subnormals are kept; NaN stays NaN.
    """
    f = format_of(fmt)
    a = np.asanyarray(x)  # shape-only arrays stay so
    out_dtype = np.dtype(dtype) if dtype is not None else a.dtype if a.dtype.kind == "f" else np.dtype(np.float64)
    v = a.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        finite = np.isfinite(v)
        _, e = np.frexp(np.where(finite, v, 1.0))  # v = m 2^e with 0.5 <= |m| < 1, so its binade is 2^(e-1)
        spacing = np.ldexp(1.0, np.maximum(e - 1, f.min_exponent) - f.mantissa_bits)
        r = np.where(finite, np.round(v / spacing) * spacing, v)  # np.round halves to even
        big = np.abs(r) > f.max
        if saturate:
            r = np.where(big & ~np.isnan(r), np.copysign(f.max, r), r)
        elif f.ieee:
            r = np.where(big & finite, np.copysign(np.inf, r), r)
        else:
            r = np.where(big, np.nan, r)  # E4M3 has no infinity: overflow and +-inf become NaN
    return r.astype(out_dtype)


def decode(bits, fmt: Format | str) -> np.ndarray:
    """The float64 values of bit patterns of ``fmt`` (unsigned integers below 2^bits)."""
    f = format_of(fmt)
    b = np.asarray(bits).astype(np.int64)
    if np.any((b < 0) | (b >= 2**f.bits)):
        raise ValueError(f"decode: {f.name} bit patterns are 0 .. {2**f.bits - 1}")
    m, eb = f.mantissa_bits, f.exponent_bits
    sign = np.where(b >> (m + eb) & 1, -1.0, 1.0)
    field = (b >> m) & (2**eb - 1)
    frac = (b & (2**m - 1)).astype(np.float64)
    normal = np.ldexp(1.0 + frac / 2**m, field - f.bias)
    sub = np.ldexp(frac / 2**m, f.min_exponent)
    v = sign * np.where(field == 0, sub, normal)
    top = field == 2**eb - 1
    if f.ieee:
        v = np.where(top, np.where(frac == 0, sign * np.inf, np.nan), v)
    else:
        v = np.where(top & (frac == 2**m - 1), np.nan, v)
    return v


def encode(x, fmt: Format | str) -> np.ndarray:
    """The bit patterns (uint32) of ``fmt`` numbers; ``x`` must hold numbers of the format exactly (use
    :func:`cast` first). NaN encodes as the all-ones pattern of its sign."""
    f = format_of(fmt)
    v = np.asarray(x, dtype=np.float64)
    exact = cast(v, f)
    same = (exact == v) | (np.isnan(exact) & np.isnan(v))
    if not np.all(same):
        bad = v[~same].ravel()[:3]
        raise ValueError(f"encode: {bad.tolist()} are not {f.name} numbers; cast them first")
    m, eb = f.mantissa_bits, f.exponent_bits
    sign = np.signbit(v).astype(np.int64) << (m + eb)
    a = np.abs(v)
    with np.errstate(invalid="ignore"):
        _, e = np.frexp(np.where(np.isfinite(a), a, 1.0))
        field = np.where(a >= f.smallest_normal, e - 1 + f.bias, 0)
        scale = np.where(field > 0, e - 1, f.min_exponent)
        frac = np.where(field > 0, np.ldexp(a, -scale) - 1.0, np.ldexp(a, -scale))
        mant = np.rint(np.where(np.isfinite(a), frac, 0.0) * 2**m).astype(np.int64)
    top = 2**eb - 1
    field = np.where(np.isinf(a), top, field)
    mant = np.where(np.isinf(a), 0, mant)
    field = np.where(np.isnan(a), top, field)
    mant = np.where(np.isnan(a), 2**m - 1, mant)
    return (sign | field.astype(np.int64) << m | mant).astype(np.uint32)


def representable(fmt: Format | str) -> np.ndarray:
    """Every finite number of a format of at most 16 bits, ascending, each once (+0 and -0 both kept)."""
    f = format_of(fmt)
    if f.bits > 16:
        raise ValueError(f"representable: {f.name} has 2^{f.bits} patterns; only formats of <= 16 bits")
    v = decode(np.arange(2**f.bits), f)
    return np.sort(v[np.isfinite(v)])
