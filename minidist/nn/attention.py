"""Causal self-attention with grouped-query heads (GQA).

``n_heads`` query heads share ``n_kv_heads`` key/value heads: query head h reads kv head
``h // (n_heads // n_kv_heads)``. ``n_kv_heads == n_heads`` is ordinary multi-head attention,
``n_kv_heads == 1`` is multi-query attention. Fewer kv heads shrink the KV cache and the wk/wv
matrices by n_heads / n_kv_heads (book ch. 31a).

The four projections are separate Linears (wq, wk, wv, wo) whose columns are grouped by head, so
tensor parallelism (lab 09) can hand each rank whole heads: a contiguous block of columns of wq,
wk, wv and the matching block of rows of wo.

Between the projections, ``self.core(q, k, v)`` computes softmax(q k^T / sqrt(hd)) v over the
causal mask, with q as (B, H, T, hd) and k, v as (B, G, T, hd). It is the one replaceable piece:
context parallelism installs ring or Ulysses attention there, selective recomputation wraps
whatever core is installed in a checkpoint, and the projections around it never change.

``window=w`` makes the core sliding-window attention (Jiang et al. 2023, Mistral 7B): query i
attends to the w keys i - w < j <= i, itself included. Information still travels further than w
tokens, one window per layer, while a decoder only ever needs the last w keys (``kv_cache.py``) and
training keeps only the band of T w probabilities per head for the backward (``autograd/attention.py``).

``forward(x, cache=layer_cache)`` is the inference path (``GPT.generate(cache=True)``): the new
tokens' keys and values join the cached ones and the queries attend over all of them with an
explicit mask of absolute positions. It bypasses ``self.core``, which assumes queries and keys are
the same positions.
"""

from __future__ import annotations

import functools

import numpy as np

from minidist.autograd import functional as F
from minidist.autograd.attention import check_window
from minidist.autograd.tensor import Tensor, tensor
from minidist.nn.layers import Linear
from minidist.nn.module import Module, as_rng


def repeat_kv(x, n_rep: int):
    """(B, G, T, hd) -> (B, G*n_rep, T, hd), each kv head repeated n_rep times next to itself."""
    if n_rep == 1:
        return x
    B, G, T, hd = x.shape
    x = x.reshape(B, G, 1, T, hd)
    return F.cat([x] * n_rep, 2).reshape(B, G * n_rep, T, hd)


def causal_attention(q, k, v, window: int | None = None):
    """The default core: exact causal attention, each kv head serving its group of query heads;
    with ``window`` each query sees only its last ``window`` keys (itself included)."""
    n_rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), is_causal=True,
                                          window=window)


def causal_core(window: int | None = None):
    """The core for ``window``: ``causal_attention`` itself, or it with the window bound (a partial, so a
    model still pickles)."""
    window = check_window(window, "causal_core")
    return causal_attention if window is None else functools.partial(causal_attention, window=window)


def visible(k_pos: np.ndarray, n_queries: int, window: int | None) -> np.ndarray:
    """(Tq, Tk) mask, True where a query may attend a key, from the keys' absolute positions; the
    queries are the last ``n_queries`` of them (the tokens just appended to a cache)."""
    q_pos = k_pos[-n_queries:, None]
    mask = k_pos[None, :] <= q_pos
    if window is not None:
        mask &= k_pos[None, :] > q_pos - window
    return mask


def cached_attention(q: Tensor, k: np.ndarray, v: np.ndarray, k_pos: np.ndarray, window: int | None) -> Tensor:
    """Attention of the new queries q (B, H, Tq, hd) over cached and new keys k, v (B, G, Tk, hd) at
    absolute positions ``k_pos`` (Tk,), causal and (with ``window``) windowed."""
    n_rep = q.shape[1] // k.shape[1]
    kt, vt = repeat_kv(tensor(k), n_rep), repeat_kv(tensor(v), n_rep)
    return F.scaled_dot_product_attention(q, kt, vt, attn_mask=visible(k_pos, q.shape[2], window))


class CausalSelfAttention(Module):
    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, bias: bool = True, *,
                 rng: np.random.Generator | int | None = None, init_std: float | None = None,
                 out_std: float | None = None, dtype="float32", window: int | None = None) -> None:
        super().__init__()
        self.window = check_window(window, "CausalSelfAttention")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model % n_heads:
            raise ValueError(f"CausalSelfAttention: d_model={d_model} is not divisible by n_heads={n_heads}")
        if n_heads % n_kv_heads:
            raise ValueError(f"CausalSelfAttention: n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}")
        rng = as_rng(rng)
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        kv_dim = n_kv_heads * self.head_dim
        self.wq = Linear(d_model, d_model, bias, rng=rng, init_std=init_std, dtype=dtype)
        self.wk = Linear(d_model, kv_dim, bias, rng=rng, init_std=init_std, dtype=dtype)
        self.wv = Linear(d_model, kv_dim, bias, rng=rng, init_std=init_std, dtype=dtype)
        self.wo = Linear(d_model, d_model, bias, rng=rng, init_std=out_std, dtype=dtype)
        self.core = causal_core(self.window)

    def forward(self, x, cache=None):
        """(B, T, d_model) -> (B, T, d_model); with ``cache`` (a ``kv_cache.LayerCache``, no_grad) the T
        tokens follow the cached ones and their keys and values are appended to it."""
        if x.ndim != 3:
            raise ValueError(f"CausalSelfAttention: expected input (B, T, d_model), got shape {tuple(x.shape)}")
        B, T, _ = x.shape
        # The head counts come from the weights, so a tensor-parallel shard with fewer heads runs unchanged.
        hd = self.head_dim
        q = self.wq(x).reshape(B, T, -1, hd).transpose(0, 2, 1, 3)  # (B, H, T, hd)
        k = self.wk(x).reshape(B, T, -1, hd).transpose(0, 2, 1, 3)  # (B, G, T, hd)
        v = self.wv(x).reshape(B, T, -1, hd).transpose(0, 2, 1, 3)
        if cache is None:
            y = self.core(q, k, v)
        else:
            (k_all, v_all), k_pos = cache.append(k.data, v.data)
            y = cached_attention(q, k_all, v_all, k_pos, self.window)
        y = y.transpose(0, 2, 1, 3).reshape(B, T, q.shape[1] * hd)
        return self.wo(y)

    def extra_repr(self) -> str:
        w = "" if self.window is None else f", window={self.window}"
        return f"n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}{w}"
