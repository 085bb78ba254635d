"""Memory accounting for training on the ledger: model state and activations as a rank really holds them
(the memory equation, chapter 19; lab 13).

Bytes per parameter are a breakdown ``{params, grads, optimizer}``, derived from the training dtype and
the optimizer: float64 AdamW keeps an 8-byte weight, an 8-byte gradient and two 8-byte moments (m, v),
32 bytes in all, and no separate master copy because the weights already are full precision.
(Mixed-precision AdamW, 2 + 2 + 12 = 16, is the same breakdown with a 2-byte weight and gradient and a
4-byte master copy beside m and v.) The strategies book the arrays they hold, element by element at
these sizes, when they allocate and release them: the flat weights or their shards and the gradient
buckets or shards and the optimizer's moments at setup (``FlatOptimizer.allocate``),
ZeRO-2's transient buckets and ZeRO-3's gathered units while they live. The sums are then the memory
equation, ``md.estimate.model_state_breakdown(psi, stage, dp, *breakdown)``, because the arrays are
sharded that way, not because it is copied (``measured.measure_held`` checks them against
tracemalloc). What the ledger does not book is listed in :data:`NOT_BOOKED`.

Activations are not guessed: :func:`graph_bytes` walks the autograd graph a forward pass recorded
and adds up the arrays that graph keeps alive for the backward, the intermediate tensors and the
arrays captured by backward closures (an attention node's probabilities, a norm's statistics).
Parameters and excluded inputs are not counted; views count their base buffer once.
"""

from __future__ import annotations

import types

import numpy as np

from minidist.autograd import Tensor

OPTIMIZER_MOMENTS = {"adamw": 2, "sgd": 1}  # state arrays per parameter (m and v; the momentum buffer)

# What a rank process holds that the ledger leaves out (a real peak exceeds the ledger's by these)
NOT_BOOKED = (
    "numpy temporaries of the forward and backward: the gradients flowing between layers and the scratch of "
    "each op, alive for one op",
    "a parameter's .grad from the moment the backward computes it until it is copied into its gradient bucket "
    "(DDP, ZeRO-1, ZeRO-2: one parameter at a time) or its unit is complete and flattened (ZeRO-3/FSDP: the "
    "unit still in its backward)",
    "the copies a collective makes (a reduce-scatter's working copy of its input bucket, a ZeRO all-gather's "
    "copy of the shard; ZeRO-2's reduced slice before it is added into the gradient shard) and the "
    "optimizer's scratch (cache-sized blocks)",
    "the Python objects around the arrays (the autograd graph's nodes and closures, modules, dicts)",
)


def state_bytes_per_param(dtype="float64", optimizer: str = "adamw") -> dict[str, int]:
    """Bytes per parameter of weights, gradients and optimizer state, e.g. float64 AdamW -> 8, 8, 16."""
    if optimizer not in OPTIMIZER_MOMENTS:
        raise ValueError(f"state_bytes_per_param: optimizer must be one of {sorted(OPTIMIZER_MOMENTS)}, "
                         f"got {optimizer!r}")
    s = np.dtype(dtype).itemsize
    return {"params": s, "grads": s, "optimizer": OPTIMIZER_MOMENTS[optimizer] * s}


def _base(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def graph_bytes(outputs, exclude=()) -> int:
    """Bytes of activation memory the recorded graph behind ``outputs`` keeps for the backward.

    Walks from ``outputs`` through every recorded node (stopping at leaves and at the tensors in
    ``exclude``), counting each distinct buffer once: node outputs and the arrays their backward
    closures hold. Leaf data (parameters, inputs) and the buffers of ``exclude`` are not counted.
    """
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    skip = {id(_base(t.data)) for t in exclude}
    counted: dict[int, int] = {}
    seen_nodes: set[int] = set()
    seen_objs: set[int] = set()
    leaves: set[int] = set()
    stack = list(outputs)

    def note(a: np.ndarray) -> None:
        b = _base(a)
        counted.setdefault(id(b), b.nbytes)

    def scan(obj, depth: int) -> None:
        """Arrays reachable from a closure cell (through nested functions, tuples and lists)."""
        if depth > 4 or id(obj) in seen_objs:
            return
        seen_objs.add(id(obj))
        if isinstance(obj, np.ndarray):
            if obj.dtype != object:
                note(obj)
        elif isinstance(obj, Tensor):
            stack.append(obj)
        elif isinstance(obj, (types.FunctionType, types.MethodType)):
            fn = obj.__func__ if isinstance(obj, types.MethodType) else obj
            for cell in fn.__closure__ or ():
                try:
                    scan(cell.cell_contents, depth + 1)
                except ValueError:  # an empty cell
                    pass
        elif isinstance(obj, (tuple, list)):
            for x in obj:
                scan(x, depth + 1)

    while stack:
        t = stack.pop()
        if id(t) in seen_nodes:
            continue
        seen_nodes.add(id(t))
        if t.data is None:  # the hidden node behind a function with several outputs: nothing of its own
            scan(t._backward, 0)
            stack.extend(t._parents)
            continue
        if t._backward is None or id(_base(t.data)) in skip:
            leaves.add(id(_base(t.data)))
            continue
        note(t.data)
        scan(t._backward, 0)
        stack.extend(t._parents)
    return int(sum(n for k, n in counted.items() if k not in skip and k not in leaves))


class ActivationLedger:
    """Allocates measured activation bytes on a rank's ledger and frees them when the backward is past.

    ``hold(nbytes)`` returns a token; ``release(token)`` frees it once (later calls are no-ops), so a
    hook that may fire twice cannot free twice. ``release_all()`` ends the step.
    """

    def __init__(self, ledger) -> None:
        self.ledger = ledger
        self._held: dict[int, float] = {}
        self._next = 0
        self.log: list[tuple[str, float]] = []  # (what, bytes) of every hold in the first micro-batch
        self._logging = True

    def hold(self, nbytes: float, what: str = "layer") -> int:
        self._next += 1
        self.ledger.alloc("activations", nbytes)
        self._held[self._next] = float(nbytes)
        if self._logging:
            self.log.append((what, float(nbytes)))
        return self._next

    def release(self, token: int) -> None:
        n = self._held.pop(token, None)
        if n is not None:
            self.ledger.free("activations", n)

    def release_all(self) -> None:
        for token in list(self._held):
            self.release(token)
        self._logging = False

