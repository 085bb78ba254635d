"""The order one rank's predicted step runs in, on its two streams (book ch6, ch27; lab 18; ``predict.py``).

Property: a step's time is the sum of its ops' closed forms taken in the order the simulator runs them, with
communication overlapping compute only where the program lets it. Here that order for each kind of step:
micro-batches on one stage with the data-parallel buckets reducing as the backward fills them (DDP, ZeRO-1 and
2), a mixture of experts reducing after its backward, pipeline passes in their schedule's order with a message
between stages, and ring attention's blocks computed while the next K/V block travels.
"""

from __future__ import annotations

from minidist.estimate.gpt_ops import Op
from minidist.estimate.stage_ops import Stage
from minidist.estimate.streams import Streams


def single_stage_step(st, stage, buckets, m, dp, zero, reduce_op, run, cost, e) -> tuple[float, float]:
    """Micro-batches one after another; the buckets reduce as the backward completes them (on the last
    micro-batch for DDP and ZeRO-1, which accumulate locally; on every one for ZeRO-2). Returns ZeRO-2's
    largest (activations, bucket buffers): a bucket is a transient buffer from the moment its first gradient
    arrives until the next one's does (after it was reduced), so at most two are alive."""
    largest = (0.0, 0.0)

    def buffers(k: int) -> float:  # ZeRO-2's bucket buffers alive once k were allocated: the last two
        return sum(n for _, n in buckets[max(k - 2, 0):k]) * e

    for i in range(m):
        reduce_now = zero == 2 or dp > 1 and i == m - 1
        run(st, stage.forward)
        finished, next_bucket, need, ends = 0, 0, buckets[0][0], []
        started, first = 0, 0  # ZeRO-2: the buckets allocated so far, the index of the next one's first gradient
        for op, alive in zip(stage.backward, stage.alive):
            run(st, [op])
            finished += len(op.grads)
            while zero == 2 and started < len(buckets) and finished > first:
                # the bucket's first gradient is in: its buffer is allocated beside the previous one (reducing),
                # and the two stay alive until the next bucket's first gradient (beside any segment rebuilt meanwhile)
                first, started = first + buckets[started][0], started + 1
                largest = max(largest, (alive, buffers(started)), key=sum)
            if zero == 2:
                largest = max(largest, (alive, buffers(started)), key=sum)
            while reduce_now and next_bucket < len(buckets) and finished >= need:
                # the bucket's last gradient is in: its reduction starts on the communication stream
                nbytes = buckets[next_bucket][1] * e
                if dp > 1:
                    ends.append(st.launch(cost(Op(reduce_op, 0, nbytes, reduce_op, "grad"))))
                next_bucket += 1
                need += buckets[next_bucket][0] if next_bucket < len(buckets) else 0
        if ends:
            st.wait(max(ends), "dp")
    return largest


def moe_step(st, stage, m, dense_buckets, expert_buckets, run, cost, e) -> None:
    """Micro-batches one after another, each gradient accumulated locally; then, as ``ExpertDataParallel``
    does, every dense bucket's all-reduce over the data group, a wait, every expert bucket's over its
    replicas (dp), a wait: no reduction overlaps the backward."""
    for _ in range(m):
        run(st, stage.forward)
        run(st, stage.backward)
    for bks, axis in ((dense_buckets, "grad"), (expert_buckets, "expert")):
        ends = [st.launch(cost(Op("all_reduce", 0, n * e, "all_reduce", axis))) for _, n in bks]
        if ends:
            st.wait(max(ends), "dp")


def walk_pipeline(ranks: list[Streams], orders, stages: list[Stage], hops: list[list[float]], run, peak_acts,
          held) -> None:
    """Every pipeline rank runs its passes in its schedule's order, as ``PipelineExecutor`` does: a receive
    right before a pass whose input is on another rank (blocking), a send right after one whose output
    another rank needs (asynchronous, waited for at the end of the step)."""
    p = len(ranks)
    nvs = len(stages)
    pos = [0] * p
    arrived: dict[tuple, float] = {}
    sends: list[list[float]] = [[] for _ in range(p)]
    live = [0.0] * p
    while any(pos[r] < len(orders[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                op, mb, chunk = orders[r][pos[r]]
                vs = chunk * p + r
                src = vs - 1 if op == "F" else vs + 1
                if 0 <= src < nvs and src % p != r:
                    key = (op, mb, src)
                    if key not in arrived:
                        break
                    ranks[r].recv(arrived.pop(key), "pp")
                st = ranks[r]
                if op == "F":
                    run(st, stages[vs].forward)
                    live[r] += held[vs]
                    peak_acts[r] = max(peak_acts[r], live[r])
                else:
                    peak_acts[r] = max(peak_acts[r], live[r] + stages[vs].rebuilt)
                    run(st, stages[vs].backward)
                    live[r] -= held[vs]
                dst = vs + 1 if op == "F" else vs - 1
                if 0 <= dst < nvs and dst % p != r:
                    t = st.send(("pp", dst % p), hops[r][dst % p])
                    arrived[(op, mb, vs)] = t
                    sends[r].append(t)
                pos[r] += 1
                moved = True
        if not moved:
            raise RuntimeError("predict_train: the pipeline schedule deadlocks")  # stage_orders never does
    for r in range(p):
        if sends[r]:
            ranks[r].wait(max(sends[r]), "pp")


def ring_attention_pass(st: Streams, op: Op, hop: float, compute) -> None:
    """Ring attention (``md.parallel.context.context_parallel.RingAttention``) on one rank of a symmetric ring: each
    step posts the K/V block to the successor and takes the predecessor's (the same arrival time, by
    symmetry), computes its blocks meanwhile, then waits. The backward also passes each block's gradient
    accumulator on after every step, behind the K/V message on the same link, and receives its own home."""
    name = "attention.block" + (".backward" if op.name.endswith("backward") else "")

    def blocks(step) -> None:
        for flops, nbytes in step:
            compute(st, name, flops, nbytes)

    p = len(op.steps)
    if not op.name.endswith("backward"):
        for t, step in enumerate(op.steps):
            arrival = st.send(("cp", 1), hop) if t < p - 1 else None
            blocks(step)
            if arrival is not None:
                st.wait(arrival, "cp")
        return
    acc = None  # arrival of the accumulator sent at the previous step
    for t, step in enumerate(op.steps):
        ends = [st.send(("cp", 1), hop)] if t < p - 1 else []
        blocks(step)
        st.wait(max(ends + ([acc] if acc is not None else []) + [st.compute]), "cp")
        acc = st.send(("cp", 1), hop)
    st.wait(acc, "cp")
