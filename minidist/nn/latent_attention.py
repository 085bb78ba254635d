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

DeepSeek-V3's shape (all optional, off by default): ``q_latent`` compresses the queries too
(``c_q = rms_norm(x W_dq)``, ``q = c_q W_uq``; with it both latents pass an RMSNorm, as in
DeepSeek-V2/V3); ``head_dim`` and ``v_head_dim`` set the per-head query/key and value widths apart
from d_model / n_heads (V3: 128 and 128 with d_model / n_heads = 56); ``rope_dim`` adds the
decoupled key: ``rope_dim`` more query numbers per head, and one key of ``rope_dim`` numbers per
token (``k_r = x W_kr``) shared by all heads and cached next to c_kv. DeepSeek rotates those parts
(RoPE) so that the nope parts can stay absorbable; minidist has learned absolute positions and no
rotary embedding, so here they are not rotated: the shapes, the weights, the FLOPs, the cache and
the score scale ``1/sqrt(head_dim + rope_dim)`` are DeepSeek's, the position signal is not.

Between the projections the same replaceable ``self.core(q, k, v)`` as ``CausalSelfAttention``
runs, so the causal core, its sliding window and selective recomputation apply unchanged.
"""

from __future__ import annotations

import numpy as np

from minidist.autograd import functional as F
from minidist.autograd.attention import check_window
from minidist.autograd.tensor import tensor
from minidist.nn.attention import cached_attention, causal_core
from minidist.nn.layers import Linear, RMSNorm
from minidist.nn.module import Module, as_rng


class LatentSelfAttention(Module):
    """Causal self-attention whose keys and values come from a shared latent of ``kv_latent`` numbers per token.

    Parameters: wq and wo (d_model x d_model each), w_dkv (d_model x kv_latent) and w_uk, w_uv
    (kv_latent x d_model each), each with a bias when ``bias``. With the options (H heads, d = head_dim,
    r = rope_dim, dv = v_head_dim): wq is d_model x H (d + r), or w_dq (d_model x q_latent), q_norm and
    w_uq (q_latent x H (d + r)); w_kr (d_model x r) when r > 0; kv_norm with q_latent; w_uk is
    kv_latent x H d, w_uv kv_latent x H dv, wo H dv x d_model.
    """

    def __init__(self, d_model: int, n_heads: int, kv_latent: int, bias: bool = True, *,
                 rng: np.random.Generator | int | None = None, init_std: float | None = None,
                 out_std: float | None = None, dtype="float32", window: int | None = None,
                 q_latent: int | None = None, head_dim: int | None = None, v_head_dim: int | None = None,
                 rope_dim: int = 0) -> None:
        super().__init__()
        if head_dim is None and d_model % n_heads:
            raise ValueError(f"LatentSelfAttention: d_model={d_model} is not divisible by n_heads={n_heads}")
        for name, v, low in (("kv_latent", kv_latent, 1), ("q_latent", q_latent, 1), ("head_dim", head_dim, 1),
                             ("v_head_dim", v_head_dim, 1), ("rope_dim", rope_dim, 0)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low):
                raise ValueError(f"LatentSelfAttention: {name} must be an int >= {low}, got {v!r}")
        self.window = check_window(window, "LatentSelfAttention")
        rng = as_rng(rng)
        # every query head has its own key and value head, read out of the latent
        hd = d_model // n_heads if head_dim is None else int(head_dim)
        self.n_heads, self.n_kv_heads, self.head_dim, self.kv_latent = n_heads, n_heads, hd, kv_latent
        self.v_head_dim = hd if v_head_dim is None else int(v_head_dim)
        self.rope_dim, self.q_latent = int(rope_dim), q_latent
        q_out = n_heads * (hd + self.rope_dim)
        if q_latent is None:
            self.wq = Linear(d_model, q_out, bias, rng=rng, init_std=init_std, dtype=dtype)
        else:
            self.w_dq = Linear(d_model, q_latent, bias, rng=rng, init_std=init_std, dtype=dtype)
            self.q_norm = RMSNorm(q_latent, dtype=dtype)
            self.w_uq = Linear(q_latent, q_out, bias, rng=rng, init_std=init_std, dtype=dtype)
        self.w_dkv = Linear(d_model, kv_latent, bias, rng=rng, init_std=init_std, dtype=dtype)
        if self.rope_dim:
            self.w_kr = Linear(d_model, self.rope_dim, bias, rng=rng, init_std=init_std, dtype=dtype)
        self.kv_norm = RMSNorm(kv_latent, dtype=dtype) if q_latent is not None else None
        self.w_uk = Linear(kv_latent, n_heads * hd, bias, rng=rng, init_std=init_std, dtype=dtype)
        self.w_uv = Linear(kv_latent, n_heads * self.v_head_dim, bias, rng=rng, init_std=init_std, dtype=dtype)
        self.wo = Linear(n_heads * self.v_head_dim, d_model, bias, rng=rng, init_std=out_std, dtype=dtype)
        self.core = causal_core(self.window)

    def forward(self, x, cache=None):
        """(B, T, d_model) -> (B, T, d_model); with ``cache`` (a ``kv_cache.LayerCache``, no_grad) the T
        tokens follow the cached ones and only their latents are appended to it."""
        if x.ndim != 3:
            raise ValueError(f"LatentSelfAttention: expected input (B, T, d_model), got shape {tuple(x.shape)}")
        B, T, _ = x.shape
        H, hd, r = self.n_heads, self.head_dim, self.rope_dim
        q = self.wq(x) if self.q_latent is None else self.w_uq(self.q_norm(self.w_dq(x)))
        q = q.reshape(B, T, H, hd + r).transpose(0, 2, 1, 3)  # (B, H, T, hd + r): the nope and rope parts
        c_kv = self.w_dkv(x)  # (B, T, c): all a decoder keeps of this token (with k_r when rope_dim)
        k_r = self.w_kr(x) if r else None  # (B, T, r): one decoupled key per token, shared by the heads
        if cache is not None:
            kept, k_pos = cache.append(c_kv.data, *(() if k_r is None else (k_r.data,)))
            c_kv, k_r = tensor(kept[0]), (tensor(kept[1]) if r else None)
        if self.kv_norm is not None:
            c_kv = self.kv_norm(c_kv)
        t = c_kv.shape[1]
        k = self.w_uk(c_kv).reshape(B, t, H, hd).transpose(0, 2, 1, 3)  # (B, H, t, hd)
        if r:
            k_r = k_r.reshape(B, 1, t, r)
            k = F.cat([k, F.cat([k_r] * H, 1)], 3)  # (B, H, t, hd + r)
        v = self.w_uv(c_kv).reshape(B, t, H, self.v_head_dim).transpose(0, 2, 1, 3)
        if cache is None:
            y = self.core(q, k, v)
        else:
            y = cached_attention(q, k.data, v.data, k_pos, self.window)
        y = y.transpose(0, 2, 1, 3).reshape(B, T, H * self.v_head_dim)
        return self.wo(y)

    def extra_repr(self) -> str:
        w = "" if self.window is None else f", window={self.window}"
        extra = "".join(f", {n}={getattr(self, n)}" for n in ("q_latent", "v_head_dim", "rope_dim")
                        if getattr(self, n) not in (None, 0, self.head_dim))
        return f"n_heads={self.n_heads}, head_dim={self.head_dim}, kv_latent={self.kv_latent}{extra}{w}"
