"""Pipeline bubbles, efficiency and in-flight activations (book ch16, ch24, ch31a; lab 10).

Property: separability of f_L o ... o f_1 lets stages work on different micro-batches at once; the
price is the fill and drain of the pipeline. Convention: ``pipeline_bubble`` returns the *idle
fraction of the whole pipeline span* (bubble / (work + bubble)), e.g. (p-1)/(m+p-1) for GPipe and
1F1B. Pass ``relative_to="ideal"`` for the other convention the book also uses, bubble / work
((p-1)/m for 1F1B, (p-1)/(m v) interleaved); the two differ, which is the book's interleaved slip.
"""

from __future__ import annotations

import math

from minidist.estimate._check import choice, count, nonnegative

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "dualpipe", "dualpipev")


def _bubble_over_work(stages: int, microbatches: int, schedule: str, virtual: int,
                      costs: tuple[float, float, float] | None = None) -> float:
    """Bubble time divided by useful time; ``costs`` = (F, I, W), a micro-batch's forward, input-gradient and
    weight-gradient passes (default equal). Only ZB-H1 depends on them: the others' bubble is whole passes."""
    p, m, v = stages, microbatches, virtual
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / m
    if schedule == "interleaved":
        return (p - 1) / (m * v)
    if schedule == "zb-h1":
        # Qi et al. 2024: each of the p - 1 fill-and-drain slots idles F + I - W, the deferred W filling the
        # rest; a W longer than F or I cannot shrink it below the longer of the two, which some stage waits for
        # in any case (tests/test_pipeline_schedules.py walks the schedule for both cases)
        f, i, w = costs or (1.0, 1.0, 1.0)
        return (p - 1) * max(f + i - w, f, i) / (m * (f + i + w))
    if schedule == "zb-h2":  # fills the bubble completely at (2p-1) micro-batches of activation memory
        return 0.0
    if schedule == "dualpipev":  # md.parallel's V placement: the fill and the drain in half-stage chunks, so
        return (p - 1) / (6 * m)  # half of ZB-H1's idle time (measured by tests/test_dualpipe.py)
    # dualpipe (DeepSeek-V3 report, Table 2): bubble (p/2 - 1)(F&B + B - 3W), with F&B the time of a forward
    # and a backward chunk run together (F + B: overlapping them hides communication, not compute), so with
    # F = I = W = 1 the bubble is 2 (p/2 - 1) = p - 2 over m (F + B) = 3m of work: less than ZB-H1's (p-1)/(3m)
    # and far below half of 1F1B's, the earlier rule of thumb
    return (p - 2) / (3 * m) if p > 2 else 0.0


def pipeline_bubble(stages: int, microbatches: int, schedule: str = "1f1b", virtual: int = 1,
                    relative_to: str = "total", costs: tuple[float, float, float] | None = None) -> float:
    """Idle fraction of a pipeline with ``stages`` stages and ``microbatches`` micro-batches (``m >= p`` beyond
    GPipe and 1F1B).

    relative_to="total" (default): bubble / (work + bubble), i.e. gpipe and 1f1b (p-1)/(m+p-1);
    interleaved with v virtual stages per device (p-1)/(m v + p-1); zb-h1 (p-1)/(3m + p-1) with equal passes,
    (p-1) max(F + I - W, F, I) / (m (F + I + W)) of the work for ``costs=(F, I, W)``, the seconds of a
    micro-batch's forward, input-gradient and weight-gradient passes (under the roofline W is a third of F:
    the deferred weight gradients fill less of the bubble than equal passes promise);
    zb-h2 0; dualpipe (p-2)/(3m + p-2) (DeepSeek-V3's (p/2 - 1)(F&B + B - 3W) with F = I = W); dualpipev
    (md.parallel's V-shaped schedule) (p-1)/(6m + p-1).
    relative_to="ideal": bubble / work, i.e. (p-1)/m, (p-1)/(m v), (p-1)/(3m), 0, (p-2)/(3m).
    """
    fn = "pipeline_bubble"
    p, m, v = count(fn, "stages", stages), count(fn, "microbatches", microbatches), count(fn, "virtual", virtual)
    choice(fn, "schedule", schedule, SCHEDULES)
    choice(fn, "relative_to", relative_to, ("total", "ideal"))
    if v != 1 and schedule != "interleaved":
        raise ValueError(f"{fn}: virtual={v} needs schedule='interleaved', got {schedule!r}")
    if costs is not None:
        if not (isinstance(costs, (tuple, list)) and len(costs) == 3
                and all(isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c > 0
                        for c in costs)):
            raise ValueError(f"{fn}: costs must be (F, I, W), three positive finite seconds, got {costs!r}")
        if schedule in ("zb-h2", "dualpipe", "dualpipev"):
            raise ValueError(f"{fn}: costs are modelled for zb-h1 (and do not change gpipe, 1f1b, interleaved); "
                             f"{schedule}'s bubble with unequal passes is not, got costs={costs!r}")
    r = _bubble_over_work(p, m, schedule, v, None if costs is None else tuple(map(float, costs)))
    return r if relative_to == "ideal" else r / (1 + r)


def pipeline_efficiency(stages: int, microbatches: int, schedule: str = "1f1b", virtual: int = 1) -> float:
    """Busy fraction 1 - bubble, e.g. m/(m+p-1) for 1F1B (ch24's eta_pipe)."""
    return 1 - pipeline_bubble(stages, microbatches, schedule, virtual)


def inflight_microbatches(stages: int, microbatches: int, schedule: str = "1f1b", virtual: int = 1) -> float:
    """Micro-batches of activations the first stage holds at peak: m for GPipe, min(p, m) for 1F1B and
    ZB-H1, (2p-1) for ZB-H2, p + 1 for DualPipe (DeepSeek-V3 report, Table 2); interleaved holds
    p (1 + (p-1)/(p v)) stage-equivalents (Narayanan et al. 2021)."""
    fn = "inflight_microbatches"
    p, m, v = count(fn, "stages", stages), count(fn, "microbatches", microbatches), count(fn, "virtual", virtual)
    choice(fn, "schedule", schedule, SCHEDULES)
    if schedule == "gpipe":
        return m
    if schedule == "interleaved":
        return min(m, p * (1 + (p - 1) / (p * v)))
    if schedule == "zb-h2":
        return min(m, 2 * p - 1)
    if schedule == "dualpipe":
        return min(m, p + 1)
    if schedule == "dualpipev":  # 2p + 1 half-stage chunks at most (md.parallel.pipeline.dualpipe.dualpipev)
        return min(m, p + 0.5)
    return min(p, m)


def stage_balance_efficiency(stage_times: list[float]) -> float:
    """Load balance of a pipeline: sum(t_i) / (p max t_i) (ch16)."""
    ts = [nonnegative("stage_balance_efficiency", f"stage_times[{i}]", t) for i, t in enumerate(stage_times)]
    if not ts or max(ts) == 0:
        raise ValueError("stage_balance_efficiency: stage_times must be non-empty with a positive maximum")
    return sum(ts) / (len(ts) * max(ts))


def stage_orders(schedule: str, stages: int, microbatches: int, virtual: int = 1) -> list[list[tuple[str, int, int]]]:
    """Per stage, the order it runs its passes: ``("F" | "B", micro-batch, chunk)``. A schedule is this order
    and nothing else (the runtime's ``md.parallel.make_schedule`` builds the same lists, a test checks it):

    - gpipe: every forward, then every backward;
    - 1f1b: stage s warms up with min(p - s - 1, m) forwards, then alternates one forward and one
      backward, then drains;
    - interleaved (v chunks per stage, chunk c of stage s is virtual stage c p + s): micro-batches go round
      in groups of p, each group through chunks 0..v-1 forward (v-1..0 backward); stage s warms up with
      2 (p - s - 1) + (v - 1) p chunk-forwards, then alternates, then drains.
    """
    fn = "stage_orders"
    choice(fn, "schedule", schedule, ("gpipe", "1f1b", "interleaved"))
    p, m, v = count(fn, "stages", stages), count(fn, "microbatches", microbatches), count(fn, "virtual", virtual)
    if schedule != "interleaved" and v != 1:
        raise ValueError(f"{fn}: virtual={v} needs schedule='interleaved'")
    if schedule == "gpipe":
        return [[("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)] for _ in range(p)]
    if schedule == "interleaved":
        if m > p and m % p:
            raise ValueError(f"{fn}: interleaved needs microbatches ({m}) a multiple of stages ({p}) or at most {p}")
        groups = [(g0, min(p, m - g0)) for g0 in range(0, m, p)]
        fwd = [(g0 + i, c) for g0, g in groups for c in range(v) for i in range(g)]
        bwd = [(g0 + i, c) for g0, g in groups for c in reversed(range(v)) for i in range(g)]
        warm_of = [min(2 * (p - s - 1) + (v - 1) * p, m * v) for s in range(p)]
    else:
        fwd = bwd = [(i, 0) for i in range(m)]
        warm_of = [min(p - s - 1, m) for s in range(p)]
    out = []
    for warm in warm_of:
        order = [("F", *fwd[k]) for k in range(warm)]
        for k in range(len(fwd) - warm):
            order += [("F", *fwd[warm + k]), ("B", *bwd[k])]
        out.append(order + [("B", *bwd[k]) for k in range(len(fwd) - warm, len(fwd))])
    return out
