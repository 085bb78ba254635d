"""Activation recomputation: keep fewer activations, run parts of the forward again in the backward
(chapter 21, lab 14).

The property: a layer's activations are a deterministic function of its input and weights, so they
can be thrown away after the forward and rebuilt when the backward needs them, trading one extra
forward of that part for its memory.

* every ``k`` layers: ``L/k`` segment inputs are kept; the backward of a segment rebuilds its ``k``
  layers, so at most (L/k + k) layers' worth of activations are alive, minimised near k = sqrt(L);
* ``"full"`` is k = 1: only each layer's input survives the forward;
* ``"selective"`` keeps the layer but drops the attention probabilities (b h s^2 per layer, the
  term that grows with the square of the sequence) and recomputes only attention's core.

The ledger records what is really held: segment boundaries during the forward, one rebuilt
segment at a time during the backward (freed once that segment's backward is done).
"""

from __future__ import annotations

from minidist.autograd import checkpoint, is_grad_enabled
from minidist.parallel.memory import ActivationLedger, graph_bytes


def segments(lo: int, hi: int, every: int | None, first: int | None = None) -> list[tuple[int, int, bool]]:
    """Blocks ``lo..hi-1`` as half-open ranges run as one unit, each with whether it is checkpointed:
    ``[(lo, lo+k, True), ...]`` for segments of ``every`` = k layers; one unchecked range per layer when
    ``every`` is None. ``first`` = n (with k = 1): only the first n layers are checkpointed (Megatron's
    block method, which spends the memory a stage has left on keeping its last layers)."""
    if every is None:
        return [(i, i + 1, False) for i in range(lo, hi)]
    if first is not None:
        return [(i, i + 1, i < lo + first) for i in range(lo, hi)]
    return [(i, min(i + every, hi), True) for i in range(lo, hi, every)]


def run_checkpointed(fn, x, acts: ActivationLedger):
    """``fn(x)`` under :func:`checkpoint`, accounting the rebuilt activations while its backward runs."""

    def rebuild(inp):
        out = fn(inp)
        if is_grad_enabled() and acts is not None:  # the recomputation inside the backward
            token = acts.hold(graph_bytes(out, exclude=[inp]), "rebuilt")
            inp.register_post_accumulate_grad_hook(lambda _t: acts.release(token))
        return out

    return checkpoint(rebuild, x)


def selective_core(core, acts: ActivationLedger | None):
    """``core`` (an attention core, see ``CausalSelfAttention.core``) under :func:`checkpoint`.

    The projections and their outputs stay in the graph; the attention probabilities are rebuilt from
    q, k, v during the backward, and that rebuilt memory is held on ``acts`` until q's gradient is done.
    Whatever core is installed (plain, ring, Ulysses, a tensor-parallel shard of the heads) is the one
    recomputed, so the layouts compose.
    """

    def rebuilt(q, k, v):
        y = core(q, k, v)
        if is_grad_enabled() and acts is not None:
            token = acts.hold(graph_bytes(y, exclude=[q, k, v]), "rebuilt_attention")
            q.register_post_accumulate_grad_hook(lambda _t: acts.release(token))
        return y

    return lambda q, k, v: checkpoint(rebuilt, q, k, v)
