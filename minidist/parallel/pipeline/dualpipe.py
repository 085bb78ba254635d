"""DualPipeV: the pipeline folded into a V (book ch16, ch31a, ch35; lab 22).

Property: separability, as for every pipeline, plus a placement that turns round. DeepSeek-V3's DualPipe feeds
micro-batches into both ends of the pipeline so that one direction's forward overlaps the other's backward, at the
price of two copies of the weights; folding the 2p pieces of the model into a V (rank r holds pieces r and
2p - 1 - r, the ``"v"`` placement of ``schedules.py``) keeps one copy, lets the pipeline turn round on the last
rank without a message, and puts the embedding and the loss on rank 0.
"""

from __future__ import annotations

from minidist.parallel.pipeline.schedules import (
    BUILDERS,
    Action,
    Schedule,
    ScheduleError,
    _args,
    rank_of,
    with_communication,
)


def dualpipev(stages: int, microbatches: int) -> Schedule:
    """DualPipeV (DeepSeek-AI 2024's DualPipe, in the V-shaped form of Sea AI Lab 2025 that keeps one copy of the
    weights): 2p virtual stages on the ``"v"`` placement, the backward split into I and W as in zero bubble.

    The order is found by running the pipeline once with equal unit costs per chunk (F = I = W), every rank
    taking, whenever it is free, the first ready action in this preference: an input gradient I (the critical
    path); then a forward F, of chunk 1 always (it carries a micro-batch already under way), of chunk 0 (which
    lets a new one in) only while at most ``2p`` chunks wait for their weight gradient on this rank (1F1B's bound
    of p stages of activations, in half-stage chunks, plus one chunk); then a weight gradient W, which fills the
    holes; lower micro-batches first. Each rank's list is the order it ran in, so every dependency is met and,
    with buffered sends, no timing can deadlock it.

    With F = I = W the bubble is ``(p - 1) / (6 m + p - 1)``: each rank idles ``(p - 1) / 2`` stage-times against
    zero bubble's ``p - 1`` (``(p - 1) / (3 m + p - 1)``), because the fill and the drain are made of half-stage
    chunks and the V turns round on the last rank without a message. The activations held peak at most
    ``(p + 1) / p`` times 1F1B's, the bound DeepSeek-V3 reports for DualPipe (``tests/test_dualpipe.py`` measures
    both). ``microbatches`` must be at least ``2 p``, so that the two directions overlap in the steady state.
    """
    _args("dualpipev", stages, microbatches)
    p, m = stages, microbatches
    if m < 2 * p:
        raise ValueError(f"dualpipev: microbatches ({m}) must be at least 2 x stages ({2 * p}), so that the "
                         f"pipeline's two directions overlap")
    nvs = 2 * p

    def where(vs: int) -> tuple[int, int]:
        return rank_of("v", p, vs), (0 if vs < p else 1)

    done: dict[tuple[str, int, int], int] = {}  # (op, mb, vs) -> time it finished
    busy = [0] * p  # time each rank is free
    order: list[list[Action]] = [[] for _ in range(p)]
    waiting = [0] * p  # chunks forwarded on this rank and not yet through their W
    left = {(op, mb, vs) for op in "FIW" for mb in range(m) for vs in range(nvs)}

    def ready(op: str, mb: int, vs: int, t: int) -> bool:
        if (op, mb, vs) not in left:
            return False
        if op == "F":
            return vs == 0 or done.get(("F", mb, vs - 1), t + 1) <= t
        if op == "I":
            if done.get(("F", mb, vs), t + 1) > t:
                return False
            return vs == nvs - 1 or done.get(("I", mb, vs + 1), t + 1) <= t
        return done.get(("I", mb, vs), t + 1) <= t

    def earliest(op: str, stages: list[int], t: int) -> tuple[str, int, int] | None:
        """The ready ``op`` of the lowest micro-batch on one of ``stages`` (in their order), if any."""
        for mb in range(m):
            for vs in stages:
                if ready(op, mb, vs, t):
                    return op, mb, vs
        return None

    t = 0
    while left:
        for r in range(p):
            if busy[r] > t:
                continue
            mine = [r, nvs - 1 - r]  # this rank's virtual stages, chunk 0 and chunk 1
            pick = earliest("I", mine[::-1], t)
            for vs in reversed(mine):  # a new micro-batch (chunk 0) only under the bound; chunk 1 always
                if pick is not None or (vs == r and waiting[r] > 2 * p):
                    continue
                for mb in range(m):
                    if ready("F", mb, vs, t):
                        pick = ("F", mb, vs)
                        break
            if pick is None:
                pick = earliest("W", mine[::-1], t)
            if pick is None:
                continue
            op, mb, vs = pick
            left.discard(pick)
            done[pick] = t + 1
            busy[r] = t + 1
            waiting[r] += {"F": 1, "I": 0, "W": -1}[op]  # a chunk's memory is freed by its W (I keeps a stash)
            order[r].append(Action(op, mb, where(vs)[1]))
        t += 1
        if t > 10 * nvs * m:  # cannot happen: every chain of dependencies ends in an action someone may take
            raise ScheduleError(f"dualpipev: no order found for p={p}, m={m}")
    return Schedule("dualpipev", p, m, 2, with_communication(order, p, 2, "v"), placement="v")


BUILDERS["dualpipev"] = dualpipev
