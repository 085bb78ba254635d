"""The Tensor: a numpy array that remembers which operation made it.

Reverse-mode differentiation in one paragraph (micrograd's idea, on arrays). Every operation
on tensors that require grad produces a new tensor holding a link to its inputs (``_parents``)
and a closure (``_backward``) that maps the gradient of the loss with respect to the output to
the gradients with respect to each input: one local application of the chain rule. The recorded
operations form a DAG from the parameters to the loss. ``loss.backward()`` walks that DAG from
the loss back to the leaves; a tensor used by several operations receives the *sum* of the
gradients flowing back from each use (reverse accumulation), and its own closure runs only once
that sum is complete. Leaves (parameters, inputs) store the result in ``.grad``.

Operators and methods (``+``, ``@``, ``sum``, ``exp`` ...) are attached to the class in
``ops.py``; the traversal itself lives in ``engine.py``, which attaches ``Tensor.backward``. This
module holds the data structure and the dtype rules shared by every operation, and imports neither.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from minidist.autograd import grad_mode as _gm

Backward = Callable[[Any], tuple]


class RemovableHandle:
    """Returned by ``register_hook``: ``handle.remove()`` unregisters the hook."""

    __slots__ = ("_hooks", "_fn")

    def __init__(self, hooks: list, fn: Callable) -> None:
        self._hooks, self._fn = hooks, fn

    def remove(self) -> None:
        if self._fn in self._hooks:
            self._hooks.remove(self._fn)


class Tensor:
    """An ndarray plus what reverse-mode differentiation needs.

    ``Tensor(data)`` wraps ``data`` without copying (use ``minidist.tensor`` for a copy). Float
    tensors (float16/32/64) can require grad; integer and bool tensors are plain data (token ids,
    indices, masks). ``backward`` is defined in ``engine.py``, beside the traversal it starts.
    """

    __slots__ = ("data", "grad", "requires_grad", "_parents", "_backward", "_op", "_hooks", "_post_hooks",
                 "_retains_grad", "__weakref__")
    # numpy must hand ``ndarray + tensor`` to Tensor.__radd__ instead of converting the tensor.
    __array_ufunc__ = None

    def __init__(self, data: Any, requires_grad: bool = False) -> None:
        if isinstance(data, Tensor):
            data = data.data
        data = np.asanyarray(data)  # a shape-only array stays one (shape_only.py)
        if requires_grad and data.dtype.kind != "f":
            raise TypeError(f"only floating-point tensors can require grad, got dtype {data.dtype}")
        self.data = data
        self.grad: np.ndarray | None = None
        self.requires_grad = bool(requires_grad)
        self._parents: tuple = ()
        self._backward: Backward | None = None
        self._op = ""
        self._hooks: list | None = None
        self._post_hooks: list | None = None
        self._retains_grad = False

    # ------------------------------------------------------------------ array-like attributes
    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def size(self) -> int:
        return self.data.size

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def __len__(self) -> int:
        if self.data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.data.shape[0]

    def __array__(self, dtype=None, copy=None):
        return self.data if dtype is None else self.data.astype(dtype)

    def numpy(self) -> np.ndarray:
        """The underlying array (shared, not copied)."""
        return self.data

    def item(self) -> float | int | bool:
        if self.data.size != 1:
            raise ValueError(f"item(): only one-element tensors can be converted, got shape {self.shape}")
        return self.data.item()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __bool__(self) -> bool:
        if self.data.size != 1:
            raise ValueError(f"the truth value of a tensor of shape {self.shape} is ambiguous")
        return bool(self.data.item())

    # comparisons return tensors, so identity hashing must be restored explicitly
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        body = np.array2string(self.data, separator=", ", prefix="tensor(")
        extra = ""
        if self.data.dtype not in (np.float64, np.int64, np.bool_):
            extra += f", dtype={self.data.dtype}"
        if self._backward is not None:
            extra += f", grad_fn=<{self._op}>"
        elif self.requires_grad:
            extra += ", requires_grad=True"
        return f"tensor({body}{extra})"

    # ------------------------------------------------------------------ graph
    @property
    def is_leaf(self) -> bool:
        """Leaves are tensors not produced by a recorded operation; only they get ``.grad``."""
        return self._backward is None

    @property
    def grad_fn(self) -> str | None:
        """Name of the operation that produced this tensor (None for leaves)."""
        return self._op if self._backward is not None else None

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if not self.is_leaf:
            raise RuntimeError("requires_grad_ can only change leaf tensors; use .detach() first")
        if requires_grad and self.data.dtype.kind != "f":
            raise TypeError(f"only floating-point tensors can require grad, got dtype {self.data.dtype}")
        self.requires_grad = bool(requires_grad)
        return self

    def retain_grad(self) -> Tensor:
        """Also store ``.grad`` on this non-leaf tensor during backward."""
        self._retains_grad = True
        return self

    def detach(self) -> Tensor:
        """The same data (shared), cut from the graph."""
        return Tensor(self.data)

    def zero_grad(self) -> None:
        """Forget the accumulated gradient (sets ``.grad`` to None, like ``set_to_none=True``)."""
        self.grad = None

    def register_hook(self, fn: Callable[[np.ndarray], Any]) -> RemovableHandle:
        """Call ``fn(grad)`` with the total gradient flowing into this tensor during backward.

        If ``fn`` returns an array (or tensor), it replaces the gradient from then on.
        """
        if not self.requires_grad:
            raise RuntimeError("register_hook: cannot register a hook on a tensor that does not require grad")
        if self._hooks is None:
            self._hooks = []
        self._hooks.append(fn)
        return RemovableHandle(self._hooks, fn)

    def register_post_accumulate_grad_hook(self, fn: Callable[[Tensor], None]) -> RemovableHandle:
        """Call ``fn(self)`` on a leaf right after its ``.grad`` was accumulated in a backward.

        It fires as soon as every use of the leaf in the current backward has been processed, while
        the rest of the backward still runs: data parallelism starts a gradient all-reduce there.
        """
        if not self.is_leaf or not self.requires_grad:
            raise RuntimeError("register_post_accumulate_grad_hook: only leaf tensors that require grad")
        if self._post_hooks is None:
            self._post_hooks = []
        self._post_hooks.append(fn)
        return RemovableHandle(self._post_hooks, fn)


def _new(data: np.ndarray, parents: tuple, backward: Backward, op: str) -> Tensor:
    """Make the output of a recorded op (skips __init__: this is on every op's path)."""
    t = Tensor.__new__(Tensor)
    t.data = data
    t.grad = None
    t.requires_grad = True
    t._parents = parents
    t._backward = backward
    t._op = op
    t._hooks = None
    t._post_hooks = None
    t._retains_grad = False
    return t


def _const(data: np.ndarray) -> Tensor:
    """Make the output of an op that is not recorded."""
    t = Tensor.__new__(Tensor)
    t.data = data
    t.grad = None
    t.requires_grad = False
    t._parents = ()
    t._backward = None
    t._op = ""
    t._hooks = None
    t._post_hooks = None
    t._retains_grad = False
    return t


def recording(*tensors: Any) -> bool:
    """Should an op on these inputs be recorded? (grad mode on and some input requires grad)"""
    if not _gm._enabled:
        return False
    for t in tensors:
        if isinstance(t, Tensor) and t.requires_grad:
            return True
    return False


def tensor(data: Any, requires_grad: bool = False, dtype: Any = None) -> Tensor:
    """A new leaf tensor holding a *copy* of ``data`` (numpy's default dtypes unless ``dtype``).

    The data must be numbers or booleans: strings, bytes and Python objects would be carried along
    until the first arithmetic op failed far from here, so they are refused now.
    """
    if isinstance(data, Tensor):
        data = data.data
    arr = np.array(data, dtype=dtype, copy=True)
    if arr.dtype.kind not in "biufc":
        raise TypeError(f"md.tensor: data must be numbers or booleans (bool, int, float or complex), got "
                        f"{type(data).__name__} {_short(data)} (numpy dtype {arr.dtype})")
    return Tensor(arr, requires_grad=requires_grad)


def _short(x: Any, limit: int = 60) -> str:
    r = repr(x)
    return r if len(r) <= limit else r[:limit - 3] + "..."


def as_tensor(x: Any) -> Tensor:
    """``x`` itself if it is a tensor, else a constant tensor wrapping it without a copy."""
    return x if isinstance(x, Tensor) else _const(np.asanyarray(x))


_BLAS_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@functools.lru_cache(maxsize=32)
def ones(n: int, dtype: np.dtype) -> np.ndarray:
    """A cached read-only vector of ones: ``ones(len(a)) @ a`` adds up the rows of a 2-D ``a`` (one
    total per column) and ``a @ ones(a.shape[1])`` adds up each row, in one BLAS call each."""
    o = np.ones(n, dtype)
    o.flags.writeable = False
    return o


def unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``g`` back to ``shape``: the adjoint of numpy broadcasting (one reduction call)."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead > 0 and g.shape[lead:] == shape and g.dtype in _BLAS_FLOATS and g.size and g.flags.c_contiguous:
        # A bias broadcast over the leading axes: its gradient adds up the rows of a 2-D view, as a
        # matrix-vector product (several times faster than numpy's reduction over the first axis).
        rows = g.reshape(-1, math.prod(shape))
        return (ones(rows.shape[0], g.dtype) @ rows).reshape(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


_PY_SCALARS = (int, float, bool)


def operands(op: str, x: Any, y: Any) -> tuple[Tensor | None, Any, Tensor | None, Any]:
    """Return ``(x_tensor|None, x_data, y_tensor|None, y_data)`` after the dtype rules.

    Python scalars stay Python scalars (numpy keeps the array's dtype for them); numpy scalars and
    0-d arrays adopt a float tensor's dtype; ints and bools join a float dtype; two different float
    dtypes are an error, because silent promotion hides precision bugs.
    """
    xt = x if isinstance(x, Tensor) else None
    yt = y if isinstance(y, Tensor) else None
    xd = x.data if xt is not None else (x if type(x) in _PY_SCALARS else np.asanyarray(x))
    yd = y.data if yt is not None else (y if type(y) in _PY_SCALARS else np.asanyarray(y))
    if isinstance(xd, np.ndarray) and isinstance(yd, np.ndarray):  # shape-only arrays follow the same rules
        dx, dy = xd.dtype, yd.dtype
        if dx != dy:
            if yt is None and yd.ndim == 0 and dx.kind == "f":
                yd = yd.astype(dx)
            elif xt is None and xd.ndim == 0 and dy.kind == "f":
                xd = xd.astype(dy)
            elif dx.kind == "f" and dy.kind == "f":
                raise TypeError(f"{op}: cannot mix dtypes {dx} and {dy}; cast one side with .astype() first")
            elif dx.kind == "f":
                yd = yd.astype(dx)
            elif dy.kind == "f":
                xd = xd.astype(dy)
    return xt, xd, yt, yd


def broadcast_error(op: str, xd: Any, yd: Any) -> ValueError:
    return ValueError(f"{op}: shapes {np.shape(xd)} and {np.shape(yd)} cannot be broadcast together")
