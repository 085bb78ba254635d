"""Reduced precision (book ch30, lab 21): number formats emulated in numpy, bit-exact."""

from minidist.precision.formats import (
    BF16,
    E4M3,
    E5M2,
    FORMATS,
    FP16,
    FP32,
    Format,
    cast,
    decode,
    encode,
    format_of,
    representable,
)

__all__ = ["BF16", "E4M3", "E5M2", "FORMATS", "FP16", "FP32", "Format", "cast", "decode", "encode", "format_of",
           "representable"]
