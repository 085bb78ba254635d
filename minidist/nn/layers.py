"""The basic layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout.

Convention (kept everywhere, because tensor parallelism splits these arrays): a ``Linear``
stores its weight as (in_features, out_features) and computes ``y = x @ W + b``, the book's
``Y = XW``. Column-parallel splits ``W[:, cols]`` (each rank computes some outputs),
row-parallel splits ``W[rows, :]`` (each rank holds some inputs and produces partial sums).
"""

from __future__ import annotations

import math

import numpy as np

from minidist.autograd import functional as F
from minidist.autograd.shape_only import array_kind
from minidist.nn.module import Module, Parameter, as_rng


def affine(x, weight, bias):
    """``x @ weight + bias`` (``bias`` may be None): the product every Linear computes."""
    y = x @ weight
    return y + bias if bias is not None else y


class Linear(Module):
    """``y = x @ weight + bias`` with ``weight`` of shape (in_features, out_features).

    Default init is PyTorch's: uniform in +-1/sqrt(in_features) for weight and bias. With
    ``init_std`` the weight is normal(0, init_std) and the bias zero (GPT-2's scheme).

    ``affine`` is a seam: the product goes through it, so a strategy can install a version with another
    backward (a zero-bubble pipeline's, which defers the weight gradient) without rewriting the module.
    """

    affine = staticmethod(affine)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 rng: np.random.Generator | int | None = None, init_std: float | None = None,
                 dtype="float32") -> None:
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise ValueError(f"Linear: in_features and out_features must be >= 1, got {in_features}, {out_features}")
        rng = as_rng(rng)
        self.in_features, self.out_features = in_features, out_features
        if init_std is None:
            k = 1.0 / math.sqrt(in_features)
            w = rng.uniform(-k, k, (in_features, out_features))
            b = rng.uniform(-k, k, out_features) if bias else None
        else:
            w = rng.normal(0.0, init_std, (in_features, out_features))
            b = np.zeros(out_features, like=array_kind()) if bias else None
        # Draw in float64 and cast, so a float32 model holds the rounded weights of the float64 one.
        self.weight = Parameter(w.astype(dtype))
        self.bias = Parameter(b.astype(dtype)) if bias else None

    def forward(self, x):
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Linear: input has last dimension {x.shape[-1]}, expected in_features="
                             f"{self.in_features} (input shape {tuple(x.shape)})")
        return self.affine(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """A lookup table: row ``i`` of ``weight`` (num_embeddings, dim) is the vector of token ``i``."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, rng: np.random.Generator | int | None = None,
                 init_std: float = 1.0, dtype="float32") -> None:
        super().__init__()
        rng = as_rng(rng)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = Parameter(rng.normal(0.0, init_std, (num_embeddings, embedding_dim)).astype(dtype))

    def forward(self, ids):
        ids = np.asarray(getattr(ids, "data", ids))
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_embeddings):
            raise IndexError(f"Embedding: ids must lie in [0, {self.num_embeddings}), "
                             f"got range [{ids.min()}, {ids.max()}] (ids shape {ids.shape})")
        return F.embedding(ids, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class LayerNorm(Module):
    """Normalise the last dimension to zero mean and unit variance, then scale and shift."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, dtype="float32") -> None:
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = Parameter(np.ones(dim, dtype=dtype, like=array_kind()))
        self.bias = Parameter(np.zeros(dim, dtype=dtype, like=array_kind())) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


class RMSNorm(Module):
    """Divide the last dimension by its root mean square (no centring, no shift), then scale."""

    def __init__(self, dim: int, eps: float = 1e-5, dtype="float32") -> None:
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = Parameter(np.ones(dim, dtype=dtype, like=array_kind()))

    def forward(self, x):
        return F.rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


class Dropout(Module):
    """Zero each element with probability p in training (scaling the rest by 1/(1-p)); identity in eval."""

    def __init__(self, p: float = 0.0, rng: np.random.Generator | int | None = None) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: p must lie in [0, 1), got {p}")
        self.p = p
        self.rng = as_rng(rng)

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        return F.dropout(x, self.p, True, self.rng)

    def extra_repr(self) -> str:
        return f"p={self.p}"
