"""Reduction operators and the algebra collectives rely on (chapter 11).

Every operator here is associative and commutative, which is what lets a collective regroup and
reorder the combination (a tree, a ring, a two-level scheme) and still get the same answer (up to
floating-point rounding, since float addition is not associative). Each has an identity element
used to initialise buffers. AVG is SUM followed by a division by the group size. BAND, BOR and BXOR
combine the bits of integers and booleans, as torch.distributed's do.
"""

from __future__ import annotations

import enum

import numpy as np


class ReduceOp(enum.Enum):
    SUM = "sum"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    BAND = "band"  # bitwise, on integers and booleans only
    BOR = "bor"
    BXOR = "bxor"

    @property
    def ufunc(self) -> np.ufunc:
        """The elementwise combiner (AVG combines with add; the division happens once, at the end)."""
        return UFUNCS[self]

    def identity(self, dtype) -> object:
        """The value e with e (op) x == x, for initialising accumulators."""
        dtype = np.dtype(dtype)
        if self in (ReduceOp.SUM, ReduceOp.AVG):
            return dtype.type(0)
        if self is ReduceOp.PRODUCT:
            return dtype.type(1)
        if self in (ReduceOp.BOR, ReduceOp.BXOR):
            return dtype.type(0)
        if self is ReduceOp.BAND:  # every bit set
            return dtype.type(True) if dtype.kind == "b" else dtype.type(-1) if dtype.kind == "i" else \
                np.iinfo(dtype).max
        info = np.finfo(dtype) if dtype.kind in "fc" else np.iinfo(dtype) if dtype.kind in "iu" else None
        if dtype.kind == "b":
            return self is ReduceOp.MIN
        big = np.inf if dtype.kind == "f" else info.max
        return dtype.type(big if self is ReduceOp.MIN else -big if dtype.kind == "f" else info.min)

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}"

    # Members are singletons: identity hashing keeps the per-call lookups of small collectives cheap
    # (Enum's own hash is a Python function of the name).
    __hash__ = object.__hash__


UFUNCS = {  # each op's elementwise combiner (the ufunc property, as a plain lookup for hot paths)
    ReduceOp.SUM: np.add,
    ReduceOp.AVG: np.add,
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or,
    ReduceOp.BXOR: np.bitwise_xor,
}


def as_op(op, where: str = "reduce op") -> ReduceOp:
    """Accept a ReduceOp or its name ("sum", "SUM", ...); ``where`` names the call in the error."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        try:
            return ReduceOp[op.upper()]
        except KeyError:
            pass
    raise ValueError(f"{where}: unknown reduce op {op!r}; use one of {[o.name for o in ReduceOp]}")
