"""The feed-forward block, applied to each position independently.

* ``"gelu"`` (GPT-2): ``fc2(gelu(fc1(x)))`` with d_ff = 4 d_model by default.
* ``"swiglu"`` (LLaMA): ``w_down(silu(w_gate(x)) * w_up(x))``: three matrices, so the default
  d_ff is about 8/3 d_model to keep the parameter count of the GELU block.

Tensor parallelism (Megatron, lab 09) splits fc1 / w_gate / w_up by columns and fc2 / w_down by
rows: the activation in between is elementwise, so each rank needs no communication until the
partial sums of the second matrix.
"""

from __future__ import annotations

import numpy as np

from minidist.autograd import functional as F
from minidist.nn.layers import Linear
from minidist.nn.module import Module, as_rng


class MLP(Module):
    def __init__(self, d_model: int, d_ff: int, kind: str = "gelu", bias: bool = True, *,
                 rng: np.random.Generator | int | None = None, init_std: float | None = None,
                 out_std: float | None = None, dtype="float32") -> None:
        """``init_std`` for the input matrices, ``out_std`` for the output one (None: Linear's default)."""
        super().__init__()
        rng = as_rng(rng)
        self.kind = kind
        if kind == "gelu":
            self.fc1 = Linear(d_model, d_ff, bias, rng=rng, init_std=init_std, dtype=dtype)
            self.fc2 = Linear(d_ff, d_model, bias, rng=rng, init_std=out_std, dtype=dtype)
        elif kind == "swiglu":
            self.w_gate = Linear(d_model, d_ff, bias, rng=rng, init_std=init_std, dtype=dtype)
            self.w_up = Linear(d_model, d_ff, bias, rng=rng, init_std=init_std, dtype=dtype)
            self.w_down = Linear(d_ff, d_model, bias, rng=rng, init_std=out_std, dtype=dtype)
        else:
            raise ValueError(f"MLP: kind must be 'gelu' or 'swiglu', got {kind!r}")

    def forward(self, x):
        if self.kind == "gelu":
            return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}"
