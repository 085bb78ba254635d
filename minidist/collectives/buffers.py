"""The arrays behind a collective's arguments: ``as_array`` takes a numpy array or a Tensor (anything with a
``.data`` ndarray) and checks that its dtype can be communicated; ``contiguous`` gives a C-contiguous copy to work
on and the function that writes it back. Shared by ``md.dist``'s point-to-point calls and the collectives.
"""

from __future__ import annotations

import numpy as np


def as_array(t, op: str, writable: bool = False) -> np.ndarray:
    """The ndarray behind ``t`` (an ndarray or an object with a ``.data`` ndarray)."""
    arr = t if isinstance(t, np.ndarray) else getattr(t, "data", None)
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{op}: expected a numpy array or a Tensor, got {type(t).__name__}")
    if arr.dtype.kind not in "biufc":
        raise TypeError(f"{op}: dtype {arr.dtype} cannot be communicated (numeric dtypes only)")
    if writable and not arr.flags.writeable:
        raise ValueError(f"{op}: the buffer of shape {arr.shape} is read-only but {op} writes into it")
    return arr


def contiguous(arr: np.ndarray):
    """(C-contiguous array to work on, function writing it back into ``arr`` or None)."""
    if arr.flags.c_contiguous:
        return arr, None
    tmp = arr.copy(order="C")

    def back():
        arr[...] = tmp

    return tmp, back
