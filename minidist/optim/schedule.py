"""Learning-rate schedules: linear warmup then cosine decay, and a wrapper that applies one to an optimizer.

Warmup keeps the first updates small while AdamW's second-moment estimate is still noisy; the
cosine tail anneals to ``lr_min`` (often lr_max / 10).
"""

from __future__ import annotations

import math
from collections.abc import Callable


def warmup_cosine(step: int, warmup: int, total: int, lr_max: float, lr_min: float = 0.0) -> float:
    """The learning rate for ``step`` (counting from 0).

    Steps 0 .. warmup-1 rise linearly to ``lr_max`` (``lr_max * (step + 1) / warmup``, so step 0
    already moves); steps warmup .. total follow half a cosine from ``lr_max`` down to ``lr_min``;
    after ``total`` the rate stays at ``lr_min``.
    """
    if warmup < 0 or total < warmup:
        raise ValueError(f"warmup_cosine: need 0 <= warmup <= total, got warmup={warmup}, total={total}")
    if step < warmup:
        return lr_max * (step + 1) / warmup
    if step >= total:
        return lr_min
    progress = (step - warmup) / (total - warmup)
    return lr_min + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr_max - lr_min)


class LRScheduler:
    """Sets ``lr`` in every group of ``optimizer`` to ``schedule(step)``; call :meth:`step` after each update."""

    def __init__(self, optimizer, schedule: Callable[[int], float]) -> None:
        self.optimizer = optimizer
        self.schedule = schedule
        self.last_step = 0
        self._apply()

    def _apply(self) -> None:
        lr = float(self.schedule(self.last_step))
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self) -> None:
        self.last_step += 1
        self._apply()

    def get_last_lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def state_dict(self) -> dict:
        return {"last_step": self.last_step}

    def load_state_dict(self, state: dict) -> None:
        self.last_step = int(state["last_step"])
        self._apply()
