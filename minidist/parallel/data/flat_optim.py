"""The optimizer step on whatever slice of the model a rank owns (chapter 20).

AdamW and SGD are elementwise: the update of one weight needs only that weight, its gradient and
its own state. So the same update applied to a shard (a slice of a flat buffer) gives bitwise the
same numbers as applied to the whole model, which is why ZeRO may shard the optimizer freely. The
step is given ``(weights, gradients)`` array pairs and keeps one state entry per pair; it calls the
array-level updates of ``minidist.optim``, so there is one implementation of each rule.
"""

from __future__ import annotations

import numpy as np

from minidist import dist
from minidist.optim.adamw import adamw_update_
from minidist.optim.sgd import sgd_update_


class FlatOptimizer:
    """``step(pieces)`` updates every ``(param, grad)`` pair in place; state is created on first use.

    Like ``torch.optim``, a parameter that received no gradient in a step is left alone: no decay, no
    moment update, and its step count (AdamW's bias correction) does not advance. ``step(pieces,
    skip)`` names those pieces; an expert that no token reached is the usual case.
    """

    def __init__(self, kind: str = "adamw", lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, momentum: float = 0.9) -> None:
        if kind not in ("adamw", "sgd"):
            raise ValueError(f"parallel optimizer must be 'adamw' or 'sgd', got {kind!r}")
        self.kind, self.lr, self.betas, self.eps = kind, lr, betas, eps
        self.weight_decay, self.momentum = weight_decay, momentum
        self.state: list[dict] = []

    def allocate(self, pieces: list[tuple[np.ndarray, np.ndarray]], ledger, bytes_per_param: float) -> None:
        """Create the state of ``pieces`` now, as training starts, and book it on ``ledger``: ``bytes_per_param``
        per element the arrays cover (the moments are the arrays themselves; a master copy rides along)."""
        self.state = [self._new(p) for p, _ in pieces]
        ledger.alloc("optimizer", sum(p.size for p, _ in pieces) * bytes_per_param)

    def step(self, pieces: list[tuple[np.ndarray, np.ndarray]], skip: frozenset[int] | set[int] = frozenset()) -> None:
        """Update every piece but those whose index is in ``skip`` (they got no gradient this step)."""
        if not self.state:
            self.state = [self._new(p) for p, _ in pieces]
        if len(pieces) != len(self.state):
            raise ValueError(f"FlatOptimizer.step: got {len(pieces)} pieces, state holds {len(self.state)}")
        for i, ((p, g), s) in enumerate(zip(pieces, self.state)):
            if i not in skip:
                self.update(p, g, s)

    def step_on_device(self, pieces: list[tuple[np.ndarray, np.ndarray]], dtype,
                       skip: frozenset[int] | set[int] = frozenset()) -> None:
        """``step``, charged to this rank's simulated clock. The update is elementwise and memory-bound: it
        reads and writes the weight, gradient and state, 7 arrays' worth of bytes for AdamW and 4 for SGD."""
        self.step(pieces, skip)
        arrays = 7 if self.kind == "adamw" else 4
        moved = sum(p.nbytes for i, (p, _) in enumerate(pieces) if i not in skip)
        dist.compute(bytes=arrays * moved, name="optimizer.step", dtype=dtype)

    def _new(self, p: np.ndarray) -> dict:
        if self.kind == "adamw":
            return {"step": 0, "m": np.zeros_like(p), "v": np.zeros_like(p)}
        return {"step": 0, "momentum_buffer": np.zeros_like(p)}

    def update(self, p: np.ndarray, g: np.ndarray, s: dict) -> None:
        """One piece's update (the host-side step of offloading calls this too)."""
        s["step"] += 1
        if self.kind == "adamw":
            adamw_update_(p, g, s["m"], s["v"], s["step"], lr=self.lr, beta1=self.betas[0], beta2=self.betas[1],
                          eps=self.eps, weight_decay=self.weight_decay)
        else:
            sgd_update_(p, g, s["momentum_buffer"], lr=self.lr, momentum=self.momentum,
                        weight_decay=self.weight_decay)

    def state_bytes(self) -> int:
        return int(sum(a.nbytes for s in self.state for a in s.values() if isinstance(a, np.ndarray)))
