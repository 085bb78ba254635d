"""Next-token batches: inputs are a window of the text, targets are the same window shifted by one.

Every position of ``x[b]`` is a training example whose label sits at the same position of
``y[b]``, so one (B, T) batch holds B*T predictions. Offsets are drawn from a seeded generator:
the same seed gives the same batches in every process, which is what lets a data-parallel run be
compared step by step with the single-device run (each rank takes its slice of the global batch).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def get_batch(tokens: np.ndarray, batch_size: int, seq_len: int,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One batch of random windows: ``x, y`` int64 of shape (batch_size, seq_len), ``y[:, t] = x[:, t+1]``."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"get_batch: tokens must be 1-D, got shape {tokens.shape}")
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"get_batch: batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")
    if len(tokens) < seq_len + 1:
        raise ValueError(f"get_batch: need at least seq_len + 1 = {seq_len + 1} tokens, got {len(tokens)}")
    starts = rng.integers(0, len(tokens) - seq_len, size=batch_size)
    window = tokens[starts[:, None] + np.arange(seq_len + 1)].astype(np.int64, copy=False)
    # Contiguous copies, so a batch can be sent or sliced per rank without surprises.
    return np.ascontiguousarray(window[:, :-1]), np.ascontiguousarray(window[:, 1:])


def batches(tokens: np.ndarray, batch_size: int, seq_len: int, seed: int = 0,
            steps: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``steps`` batches (forever when None) from ``np.random.default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    i = 0
    while steps is None or i < steps:
        yield get_batch(tokens, batch_size, seq_len, rng)
        i += 1


def train_val_split(tokens: np.ndarray, val_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """Split a token stream into a leading training part and a trailing validation part."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"train_val_split: val_fraction must be in [0, 1), got {val_fraction}")
    cut = int(round(len(tokens) * (1.0 - val_fraction)))
    return tokens[:cut], tokens[cut:]


def unigram_entropy(tokens: np.ndarray) -> float:
    """Entropy of the token frequencies, in nats: the loss of the best model that ignores context."""
    tokens = np.asarray(tokens)
    if tokens.size == 0:
        raise ValueError("unigram_entropy: empty token array")
    counts = np.bincount(tokens.ravel().astype(np.int64))
    p = counts[counts > 0] / tokens.size
    return float(-(p * np.log(p)).sum())
