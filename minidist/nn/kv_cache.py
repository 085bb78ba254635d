"""The KV cache: decode one token at a time without recomputing the past (book ch. 31a).

Generating token t+1 needs the keys and values of tokens 0..t in every layer. Under causal
attention they never change once computed (a token does not see the future), so each layer keeps
them and a step computes only the new token's. What a layer keeps per token is its attention's choice:

- standard, grouped-query and multi-query attention: K and V, arrays (B, G, T, hd), 2 G hd numbers;
- multi-head latent attention: the latent c_kv, an array (B, T, c), c numbers;
- a sliding window of w: only the last w positions, a rolling buffer, so the cache stops growing
  at w tokens however long the text.

``KVCache.nbytes`` measures the arrays held; ``kv_cache_bytes`` is the closed form they must match.
Memory, not compute, is what limits a decoder's batch, which is why GQA, MLA and windows exist.
"""

from __future__ import annotations

import numpy as np

from minidist.autograd.grad_mode import is_grad_enabled


class LayerCache:
    """One layer's cached arrays, time on axis -2, and the absolute position of the first one kept."""

    def __init__(self, window: int | None = None) -> None:
        self.window = window
        self.arrays: tuple[np.ndarray, ...] = ()
        self.start = 0

    def __len__(self) -> int:
        """Positions held (at most ``window``)."""
        return self.arrays[0].shape[-2] if self.arrays else 0

    @property
    def end(self) -> int:
        """The absolute position the next token will take."""
        return self.start + len(self)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    def append(self, *new: np.ndarray) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
        """Add the new tokens' arrays; return (held + new arrays, their absolute positions).

        The queries of the new tokens attend over all of the returned keys, and only then is the
        buffer cut to the last ``window``: a chunk of new tokens longer than the window still needs
        the keys that fall out of it.
        """
        if is_grad_enabled():
            raise RuntimeError("KVCache: decoding with a cache runs under md.no_grad() (the cache holds arrays, "
                               "gradients would not flow into the past tokens)")
        if self.arrays and len(new) != len(self.arrays):
            raise ValueError(f"KVCache: a layer holding {len(self.arrays)} arrays was given {len(new)}")
        full = tuple(np.concatenate([a, b], axis=-2) for a, b in zip(self.arrays, new)) if self.arrays else new
        t = full[0].shape[-2]
        positions = np.arange(self.start, self.start + t)
        if self.window is not None and t > self.window:
            # a copy, not a view: a view would keep the whole older buffer alive behind a smaller nbytes
            self.arrays = tuple(a[..., -self.window:, :].copy() for a in full)
            self.start += t - self.window
        else:
            self.arrays = tuple(np.ascontiguousarray(a) for a in full)
        return full, positions


class KVCache:
    """Per-layer caches for incremental decoding with ``GPT.forward(idx, cache=...)``.

    ``KVCache(config)`` starts empty; each forward appends its tokens. ``position`` is the number of
    tokens seen so far (the next token's position), ``nbytes`` the bytes held over all layers.
    """

    def __init__(self, config) -> None:
        if config.n_experts and config.capacity_factor is not None:
            # which tokens an expert drops depends on how many arrive together: a step of one token
            # would route differently from the whole sequence
            raise ValueError("KVCache: a mixture-of-experts model with capacity_factor set routes a batch of "
                             "tokens differently from one token at a time; use capacity_factor=None")
        self.config = config
        self.layers = [LayerCache(config.window) for _ in range(config.n_layers)]

    @property
    def position(self) -> int:
        return self.layers[0].end

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    def __repr__(self) -> str:
        return f"KVCache(layers={len(self.layers)}, position={self.position}, nbytes={self.nbytes})"


def kv_cache_bytes(config, batch: int, tokens: int, dtype_bytes: int) -> int:
    """Bytes a ``KVCache`` of ``config`` holds after ``tokens`` tokens of ``batch`` sequences (closed form).

    Per layer and token kept: 2 n_kv_heads head_dim numbers (K and V), or kv_latent numbers with
    multi-head latent attention (plus rope_dim for its decoupled key); a sliding window keeps min(tokens, window)
    tokens.
    """
    for name, v in (("batch", batch), ("tokens", tokens), ("dtype_bytes", dtype_bytes)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"kv_cache_bytes: {name} must be an int >= 0, got {v!r}")
    kv_latent = getattr(config, "kv_latent", None)
    per_token = (kv_latent + getattr(config, "rope_dim", 0) if kv_latent is not None
                 else 2 * config.n_kv_heads * config.head_dim)
    kept = tokens if config.window is None else min(tokens, config.window)
    return int(config.n_layers * batch * kept * per_token * dtype_bytes)
