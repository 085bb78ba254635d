"""Fused operations with hand-written backward (re-exported as ``minidist.nn.functional``).

Composing softmax or layer norm from primitives works, but records a dozen nodes and keeps a
dozen intermediates alive. Here each of these functions is one node: the forward keeps only what
its backward needs (softmax keeps its output, layer norm the normalised input and 1/std,
attention its probabilities) and the backward is the derivative worked out by hand. Every one is
checked against central differences in ``tests/test_autograd_functional.py``.

Where they live: ``softmax.py`` (softmax, log_softmax, cross_entropy), ``norms.py``
(layer_norm, rms_norm), ``activations.py`` (gelu, silu), ``attention.py``
(scaled_dot_product_attention), ``masking.py`` (dropout, where, masked_fill), ``indexing.py``
(embedding, cat, stack, split); ``fused.py`` holds the recording helper they share.
"""

from __future__ import annotations

from minidist.autograd.activations import gelu, silu
from minidist.autograd.attention import scaled_dot_product_attention
from minidist.autograd.indexing import cat, chunk, concatenate, embedding, split, stack
from minidist.autograd.masking import dropout, masked_fill, where
from minidist.autograd.norms import layer_norm, rms_norm
from minidist.autograd.ops import matmul, relu, sigmoid, tanh
from minidist.autograd.softmax import cross_entropy, log_softmax, softmax
from minidist.autograd.tensor import Tensor

__all__ = ["softmax", "log_softmax", "layer_norm", "rms_norm", "gelu", "silu", "relu", "sigmoid", "tanh",
           "embedding", "cross_entropy", "dropout", "where", "masked_fill", "scaled_dot_product_attention",
           "cat", "concatenate", "split", "chunk", "stack", "matmul"]


def _attach() -> None:
    Tensor.softmax = softmax
    Tensor.log_softmax = log_softmax
    Tensor.gelu = gelu
    Tensor.silu = silu
    Tensor.masked_fill = masked_fill


_attach()
