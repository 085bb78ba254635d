"""ZeRO-3's step in closed form: gathers ahead of each unit, reduce-scatters behind it (book ch20; lab 18).

Property: with sharded weights a unit (the embeddings, one block, the head) exists in full only between
the all-gather before its use and its release after it, so its time and memory follow from the order of
four events per unit, the same on every rank: before the forward (wait for the gather, start gathering
the next ``prefetch`` units), after the forward (release), before the backward (wait for the gather,
start gathering the ``prefetch`` units before it), and once its gradient is complete (release, wait for
all reductions but the newest, start its reduce-scatter). ``md.parallel.data.fsdp.ShardedModel`` runs these
hooks; :func:`sharded_step` walks them on :class:`~minidist.estimate.streams.Streams` and keeps a timeline
of the activations and the buffers (gathered units, gradients being reduced) to find the peak.
"""

from __future__ import annotations

from minidist.estimate.gpt_ops import (
    Op,
    Shard,
    activation_bytes,
    block_backward,
    block_forward,
    embed_backward,
    embed_forward,
    head_backward,
    head_forward,
)
from minidist.estimate.streams import Streams


def _units(x: Shard, layers: int) -> list[tuple[str, list[Op], list[Op]]]:
    """(key, forward ops, backward ops) of every unit in forward order. The loss's scaling by its share of the
    batch sits outside the head unit: it is a product the runner takes after the unit returns."""
    head_f, head_b = head_forward(x), head_backward(x)
    return ([("embed", embed_forward(x), embed_backward(x))]
            + [(f"block.{i}", block_forward(x), block_backward(x)) for i in range(layers)]
            + [("head", head_f[:-1], head_b[1:])])


def sharded_step(st: Streams, x: Shard, layers: int, microbatches: int, dp: int, prefetch: int, run, cost
                 ) -> tuple[list[int], dict[str, float]]:
    """One step of ``microbatches`` micro-batches; returns the units' padded sizes (elements) and the
    activations and buffers (bytes) at the moment their sum peaks."""
    units = _units(x, layers)
    e = x.e
    padded = [-(-sum(n for op in bwd for n in op.grads) // dp) * dp for _, _, bwd in units]
    acts = activation_bytes(x)
    held_of = [acts["embed"]] + [acts["block"]] * layers + [acts["head"]]
    gathered = [False] * len(units)
    gathers: dict[int, float] = {}  # unit -> end of its gather in flight
    reductions: list[tuple[float, int]] = []  # (end, bytes) of reduce-scatters in flight
    live = {"acts": 0.0, "buffers": 0.0}
    peak = {"activations": 0.0, "buffers": 0.0}

    def note() -> None:
        if live["acts"] + live["buffers"] > peak["activations"] + peak["buffers"]:
            peak.update(activations=live["acts"], buffers=live["buffers"])

    def gather(u: int) -> None:
        if gathered[u]:
            return
        live["buffers"] += padded[u] * e
        note()
        if dp > 1:
            gathers[u] = st.launch(cost(Op("all_gather", 0, padded[u] * e, "all_gather", "grad")))
        gathered[u] = True

    def ensure(u: int) -> None:
        gather(u)
        if u in gathers:
            st.wait(gathers.pop(u), "dp")

    def release(u: int) -> None:
        if gathered[u]:
            ensure(u)
            live["buffers"] -= padded[u] * e
            gathered[u] = False

    def drain(keep: int) -> None:
        while len(reductions) > keep:
            end, nbytes = reductions.pop(0)
            st.wait(end, "dp")
            live["buffers"] -= nbytes

    def reduce(u: int) -> None:
        release(u)
        drain(1)  # at most two gradient buffers alive: one reducing, one being filled
        live["buffers"] += padded[u] * e
        note()
        end = st.launch(cost(Op("reduce_scatter", 0, padded[u] * e, "reduce_scatter", "grad"))) if dp > 1 else st.comm
        reductions.append((end, padded[u] * e))

    n = len(units)
    for _ in range(microbatches):
        for u, (_, fwd, _) in enumerate(units):
            ensure(u)
            for j in range(u + 1, min(n, u + 1 + prefetch)):
                gather(j)
            run(st, fwd)
            release(u)
            live["acts"] += held_of[u]
            note()
        run(st, [head_forward(x)[-1], head_backward(x)[0]])  # the loss's scaling, before the head's hook
        for u in reversed(range(n)):
            ensure(u)
            for j in range(u - 1, max(-1, u - 1 - prefetch), -1):
                gather(j)
            if u < n - 1 and 0 < u + 1 < n - 1:
                live["acts"] -= held_of[u + 1]  # the block after this unit let go of its activations
            run(st, units[u][2])
            reduce(u)
        live["acts"] = 0.0  # the runner releases the rest at the end of the backward
        drain(0)
        for u in range(n):
            release(u)
    return padded, peak
