"""Reduced precision (book ch30, lab 21): number formats emulated in numpy bit for bit, autocast of the matrix
products, and loss scaling."""

from minidist.precision.amp import LossScaler, autocast, scaled_cast
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

__all__ = ["LossScaler", "autocast", "scaled_cast", "BF16", "E4M3", "E5M2", "FORMATS", "FP16", "FP32", "Format",
           "cast", "decode", "encode", "format_of", "representable"]
