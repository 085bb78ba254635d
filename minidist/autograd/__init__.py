"""A small reverse-mode autograd on numpy arrays (the foundation of every lab).

The chain rule, organised as reverse accumulation over a DAG: the forward records, for each
operation, its inputs and its local derivative; ``loss.backward()`` then visits the recorded
operations from the loss back to the parameters, each node multiplying the gradient it received
by its local derivative and passing the result to its inputs, where contributions from several
uses are summed. One backward costs a small constant times one forward, whatever the number of
parameters, which is why training a model is affordable at all.

    import minidist as md
    x = md.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward()            # x.grad == [2., 4.]

Files: ``tensor.py`` (the data structure, dtype rules), ``engine.py`` (the traversal),
``ops.py``, ``reductions.py``, ``shape_ops.py`` (primitive ops), ``functional.py`` (fused ops,
gathered from ``softmax.py``, ``norms.py``, ``activations.py``, ``attention.py``,
``masking.py``, ``indexing.py``), ``function.py`` (custom ops), ``checkpoint.py``
(recomputation), ``grad_mode.py`` (no_grad), ``random.py`` (dropout's default generator),
``cost.py`` (FLOP/byte reporting), ``allocator.py`` (keeps freed memory for the next array),
``shape_only.py`` (arrays with shapes and layouts but no values: the same charges at any size).
"""

from minidist.autograd import cost, engine, functional, ops  # noqa: F401  (engine and ops attach methods to Tensor)
from minidist.autograd.allocator import keep_freed_memory
from minidist.autograd.checkpoint import checkpoint
from minidist.autograd.function import Function, FunctionCtx
from minidist.autograd.grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from minidist.autograd.random import manual_seed
from minidist.autograd.tensor import RemovableHandle, Tensor, as_tensor, tensor

__all__ = ["Tensor", "tensor", "as_tensor", "no_grad", "enable_grad", "is_grad_enabled", "set_grad_enabled",
           "Function", "FunctionCtx", "checkpoint", "manual_seed", "functional", "cost", "RemovableHandle"]

keep_freed_memory()
