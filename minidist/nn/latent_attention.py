"""Multi-head latent attention (MLA, DeepSeek-V2 and V3): keys and values from one small latent per token.

Each token is first compressed to a latent ``c_kv = x W_dkv`` of c numbers (d_model -> c); every
head's key and value are then read out of it, ``k = c_kv W_uk`` and ``v = c_kv W_uv``
(c -> n_heads head_dim). Queries and the output projection are as in ``CausalSelfAttention``.

Why: a decoder caches, per token and layer, what it needs to rebuild the past's keys and values.
Standard attention caches K and V, 2 n_kv_heads head_dim numbers; MLA caches only c_kv, c numbers,
while every head keeps keys and values of its own (unlike grouped-query attention, which saves
memory by sharing them). At inference W_uk need not even be applied to the cache: the score
``q . (c_kv W_uk)`` equals ``(q W_uk^T) . c_kv``, so W_uk is absorbed into the query and the
attention reads the latent directly (and W_uv can be folded into the output projection alike).
This module applies W_uk and W_uv explicitly, the simple form with the same numbers.

Kept simple: no decoupled RoPE key (DeepSeek adds a small rotary key per token next to c_kv,
because a rotation between q and k would break the absorption; this model has learned absolute
positions and no RoPE), and no compression of the queries.

Between the projections the same replaceable ``self.core(q, k, v)`` as ``CausalSelfAttention``
runs, so the causal core, its sliding window and selective recomputation apply unchanged.
"""

from __future__ import annotations

import numpy as np

from minidist.autograd.attention import check_window
from minidist.autograd.tensor import tensor
from minidist.nn.attention import cached_attention, causal_core
from minidist.nn.layers import Linear
from minidist.nn.module import Module, as_rng


class LatentSelfAttention(Module):
    """Causal self-attention whose keys and values come from a shared latent of ``kv_latent`` numbers per token.

    Parameters: wq and wo (d_model x d_model each), w_dkv (d_model x kv_latent) and w_uk, w_uv
    (kv_latent x d_model each), each with a bias when ``bias``.
    """

    def __init__(self, d_model: int, n_heads: int, kv_latent: int, bias: bool = True, *,
                 rng: np.random.Generator | int | None = None, init_std: float | None = None,
                 out_std: float | None = None, dtype="float32", window: int | None = None) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"LatentSelfAttention: d_model={d_model} is not divisible by n_heads={n_heads}")
        if isinstance(kv_latent, bool) or not isinstance(kv_latent, (int, np.integer)) or kv_latent < 1:
            raise ValueError(f"LatentSelfAttention: kv_latent must be an int >= 1, got {kv_latent!r}")
        self.window = check_window(window, "LatentSelfAttention")
        rng = as_rng(rng)
        # every query head has its own key and value head, read out of the latent
        self.n_heads, self.n_kv_heads, self.head_dim, self.kv_latent = n_heads, n_heads, d_model // n_heads, kv_latent
        self.wq = Linear(d_model, d_model, bias, rng=rng, init_std=init_std, dtype=dtype)
        self.w_dkv = Linear(d_model, kv_latent, bias, rng=rng, init_std=init_std, dtype=dtype)
        self.w_uk = Linear(kv_latent, d_model, bias, rng=rng, init_std=init_std, dtype=dtype)
        self.w_uv = Linear(kv_latent, d_model, bias, rng=rng, init_std=init_std, dtype=dtype)
        self.wo = Linear(d_model, d_model, bias, rng=rng, init_std=out_std, dtype=dtype)
        self.core = causal_core(self.window)

    def forward(self, x, cache=None):
        """(B, T, d_model) -> (B, T, d_model); with ``cache`` (a ``kv_cache.LayerCache``, no_grad) the T
        tokens follow the cached ones and only their latents are appended to it."""
        if x.ndim != 3:
            raise ValueError(f"LatentSelfAttention: expected input (B, T, d_model), got shape {tuple(x.shape)}")
        B, T, _ = x.shape
        hd = self.head_dim
        q = self.wq(x).reshape(B, T, -1, hd).transpose(0, 2, 1, 3)  # (B, H, T, hd)
        c_kv = self.w_dkv(x)  # (B, T, c): all a decoder keeps of this token
        if cache is not None:
            (latent,), k_pos = cache.append(c_kv.data)
            c_kv = tensor(latent)
        t = c_kv.shape[1]
        k = self.w_uk(c_kv).reshape(B, t, -1, hd).transpose(0, 2, 1, 3)  # (B, H, t, hd)
        v = self.w_uv(c_kv).reshape(B, t, -1, hd).transpose(0, 2, 1, 3)
        if cache is None:
            y = self.core(q, k, v)
        else:
            y = cached_attention(q, k.data, v.data, k_pos, self.window)
        y = y.transpose(0, 2, 1, 3).reshape(B, T, q.shape[1] * hd)
        return self.wo(y)

    def extra_repr(self) -> str:
        w = "" if self.window is None else f", window={self.window}"
        return f"n_heads={self.n_heads}, head_dim={self.head_dim}, kv_latent={self.kv_latent}{w}"
