"""Mixed precision: low-precision matrix products under fp32 master weights, and loss scaling
(book ch30, lab 21).

Property: what limits a low-precision format in training is its range, not its precision. bf16 has fp32's
8 exponent bits and trains as is. fp16 has 5: gradients below its smallest subnormal (2^-24, about 6e-8)
round to zero and are lost. Because the backward is linear in the loss, multiplying the loss by ``S``
multiplies every gradient by ``S`` on the way down, lifting small gradients into range; dividing the fp32
weight gradients by ``S`` before the update undoes it exactly (S is a power of two). Too large an ``S``
overflows instead, so dynamic loss scaling halves ``S`` and skips the step whenever a gradient is inf or
NaN, and doubles it after ``growth_interval`` clean steps (Micikevicius et al. 2018; PyTorch's GradScaler
follows the same rule).

``autocast(fmt)`` rounds every matrix product's operands, result and gradients to ``fmt`` (the autograd's
``autocast`` mechanism); softmax, norms and the loss keep the working precision, and the parameters stay
the fp32 master copy the optimizer updates.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator

import numpy as np

from minidist.autograd.autocast import set_matmul_rounding
from minidist.optim.optimizer import grad_array
from minidist.precision.formats import Format, cast, format_of

SCALINGS = (None, "tensor", "block")


def scaled_cast(a: np.ndarray, fmt: Format | str, scaling: str | None = None, block: int = 32) -> np.ndarray:
    """Round ``a`` to ``fmt`` after scaling it into the format's range, then scale back.

    ``scaling=None``: plain :func:`cast`. ``"tensor"``: one scale per array, ``amax / fmt.max``, so the
    largest magnitude lands on the format's largest number (the per-tensor recipe of fp8 training).
    ``"block"``: one power-of-two scale per ``block`` consecutive elements of the last axis, the block's
    largest exponent minus the format's (the OCP microscaling, MX, rule); small blocks keep small values
    out of the subnormal range even when one outlier sets a tensor's amax.
    """
    f = format_of(fmt)
    a = np.asanyarray(a)  # shape-only arrays stay so
    if scaling is None or a.size == 0:
        return cast(a, f)
    if scaling == "tensor":
        amax = float(np.max(np.abs(a)))
        if not (np.isfinite(amax) and amax > 0):
            return cast(a, f)
        s = amax / f.max
        return (cast(a / s, f, saturate=True) * s).astype(a.dtype)
    if scaling != "block":
        raise ValueError(f"scaled_cast: scaling must be one of {SCALINGS}, got {scaling!r}")
    n = a.shape[-1] if a.ndim else 1
    pad = (-n) % block
    flat = a.reshape(-1, n) if a.ndim else a.reshape(1, 1)
    blocks = np.pad(flat, ((0, 0), (0, pad))).reshape(flat.shape[0], -1, block)
    amax = np.max(np.abs(blocks), axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1.0))), 0.0)
    s = np.exp2(e - f.max_exponent)
    out = cast(blocks / s, f, saturate=True) * s
    return out.reshape(flat.shape[0], -1)[:, :n].reshape(a.shape).astype(a.dtype)


@contextlib.contextmanager
def autocast(fmt: Format | str = "bf16", *, grad_format: Format | str | None = None, scaling: str | None = None,
             block: int = 32) -> Iterator[Format]:
    """Inside the block, matrix products run in ``fmt``: their operands and result rounded to it, their
    gradients to ``grad_format`` (default ``fmt``; fp8 recipes use E4M3 forward and E5M2 backward), the
    accumulation exact. ``scaling``/``block`` as in :func:`scaled_cast`. Run forward and backward inside it.
    Overflows to inf and NaN raise no numpy warnings inside it: loss scaling detects them."""
    f = format_of(fmt)
    g = format_of(grad_format) if grad_format is not None else f
    if scaling not in SCALINGS:
        raise ValueError(f"autocast: scaling must be one of {SCALINGS}, got {scaling!r}")
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"autocast: block must be an int >= 1, got {block!r}")
    previous = set_matmul_rounding(lambda a: scaled_cast(a, f, scaling, block),
                                   lambda a: scaled_cast(a, g, scaling, block))
    try:
        # in a narrow format inf and NaN are expected events (loss scaling looks for them), not numpy warnings
        with np.errstate(over="ignore", invalid="ignore"):
            yield f
    finally:
        set_matmul_rounding(previous)


class LossScaler:
    """Static (``dynamic=False``) or dynamic loss scaling for the optimizer of an fp32 master copy.

    Use: ``(scaler.scale * loss).backward()`` (or ``scaler.scale_loss(loss)``), then ``scaler.step(opt)``,
    which unscales the gradients, skips the update if any is inf or NaN, and adapts the scale.
    ``skipped`` counts the skipped steps and ``history`` holds the scale used at every step.
    """

    def __init__(self, init_scale: float = 2.0**16, *, dynamic: bool = True, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, min_scale: float = 1.0) -> None:
        for name, v in (("init_scale", init_scale), ("growth_factor", growth_factor), ("min_scale", min_scale)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"LossScaler: {name} must be a positive finite number, got {v!r}")
        if not 0 < backoff_factor < 1:
            raise ValueError(f"LossScaler: backoff_factor must be in (0, 1), got {backoff_factor!r}")
        if not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError(f"LossScaler: growth_interval must be an int >= 1, got {growth_interval!r}")
        self.scale = float(init_scale)
        self.dynamic, self.growth_factor, self.backoff_factor = dynamic, growth_factor, backoff_factor
        self.growth_interval, self.min_scale = growth_interval, min_scale
        self.skipped = 0
        self.history: list[float] = []
        self._clean = 0

    def scale_loss(self, loss):
        return loss * self.scale

    def unscale(self, params: Iterable) -> bool:
        """Divide every parameter's gradient by the scale in place; True if any is inf or NaN."""
        return self.unscale_arrays(g for g in (grad_array(p) for p in params) if g is not None)

    def unscale_arrays(self, grads: Iterable[np.ndarray]) -> bool:
        """Divide each gradient array by the scale in place; True if any element is inf or NaN."""
        bad = False
        for g in grads:
            bad = bad or not bool(np.all(np.isfinite(g)))
            g /= self.scale
        return bad

    def update(self, found_inf: bool) -> bool:
        """Record this step's scale and adapt it; returns whether the optimizer may step (no overflow)."""
        self.history.append(self.scale)
        if found_inf:
            self.skipped += 1
            self._clean = 0
            if self.dynamic:
                self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            return False
        self._clean += 1
        if self.dynamic and self._clean % self.growth_interval == 0:
            self.scale *= self.growth_factor
        return True

    def state_dict(self) -> dict:
        """What the scaler carries from step to step (JSON-ready): a checkpoint saves it, so that a resumed run
        scales, grows and backs off exactly as the run it continues."""
        return {"scale": self.scale, "clean": self._clean, "skipped": self.skipped, "history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self._clean = float(state["scale"]), int(state["clean"])
        self.skipped, self.history = int(state["skipped"]), [float(s) for s in state["history"]]

    def step(self, optimizer, params: Iterable | None = None) -> bool:
        """Unscale, update unless a gradient overflowed, adapt the scale; returns whether it updated."""
        params = list(optimizer.params() if params is None else params)
        ok = self.update(self.unscale(params))
        if ok:
            optimizer.step()
        return ok
