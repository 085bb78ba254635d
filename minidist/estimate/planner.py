"""Configuration search: the fastest layouts that fit (book ch27; labs 18, 25).

Property: the layout space is a product of small discrete choices, and most points fail a cheap filter
(divisibility, memory, "TP inside a node") before any timing is needed, so a pruned grid with the
analytic model of ``perf.py`` covers it in about a second even for 16,384 GPUs.

Search space: tp (divides heads and fits in a node), cp (powers of two, seq divisible by 2 cp, and tp x
cp within a node, the book's ch25 rule, unless ``cp_within_node=False``), pp (gpus divisible; layers
split into stages of ceil(L/pp), the last ones lighter; LLaMA 3 split 126 layers unevenly over 16;
``strict_pp=True`` demands L % pp == 0), dp (the rest; divides the global batch), ep (MoE only: divides
experts and dp), micro-batch size, schedule (1F1B; interleaved with v dividing the layers per stage and
m a multiple of pp; ZB-H1), recompute (none or full by default: with FlashAttention, on by default,
"selective" costs and saves the same as none) and ZeRO stage (1-3; only 0-1 with pp > 1, as Megatron and
DeepSpeed allow). For each point the fastest ZeRO stage that fits is kept. Memory must fit in
``hbm_usable`` x HBM.
"""

from __future__ import annotations

import math
from dataclasses import replace

from minidist.estimate._check import choice, count, fraction
from minidist.estimate.calibrated import CALIBRATED
from minidist.estimate.clusters import ClusterSpec
from minidist.estimate.clusters import cluster as _cluster
from minidist.estimate.memory import RECOMPUTE
from minidist.estimate.models import ModelConfig
from minidist.estimate.models import model as _model
from minidist.estimate.perf import Efficiency, Estimate, Layout, estimate_layout
from minidist.estimate.pipeline import SCHEDULES


def _powers_of_two(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length()) if (1 << i) <= limit]


def plan(model: ModelConfig | str, cluster: ClusterSpec | str, gpus: int, global_batch: int | None = None,
         seq_len: int | None = None, *, top: int = 10, zero_stages: tuple[int, ...] = (1, 2, 3),
         recompute: tuple[str | None, ...] = (None, "full"), micro_batches: tuple[int, ...] = (1, 2, 4, 8),
         schedules: tuple[str, ...] = ("1f1b", "interleaved", "zb-h1"), max_cp: int = 16, strict_pp: bool = False,
         cp_within_node: bool = True, partial_recompute: bool = True,
         efficiency: Efficiency = CALIBRATED, dp_overlap: float = 0.8, dtype: str = "bf16",
         hbm_usable: float = 0.9) -> list[Estimate]:
    """Layouts for ``model`` on ``gpus`` GPUs of ``cluster``, fastest first (at most ``top``).

    ``global_batch`` is in sequences of ``seq_len`` tokens (defaults: the model's published batch and
    context). With ``partial_recompute`` a "full" recompute point uses the fewest fully recomputed
    layers per stage that fit (Megatron's --recompute-num-layers). Each result carries memory per GPU
    by category, the step split into compute / exposed communication / bubble, and MFU. Raises
    ValueError when nothing fits or an argument is invalid.
    """
    fn = "plan"
    mdl = _model(model) if isinstance(model, str) else model
    cl = _cluster(cluster) if isinstance(cluster, str) else cluster
    n = count(fn, "gpus", gpus)
    gb = count(fn, "global_batch", mdl.global_batch if global_batch is None else global_batch)
    s = count(fn, "seq_len", mdl.seq_len if seq_len is None else seq_len)
    count(fn, "top", top)
    fraction(fn, "dp_overlap", dp_overlap)
    fraction(fn, "hbm_usable", hbm_usable, open_low=True)
    for z in zero_stages:
        choice(fn, "zero_stages", z, (0, 1, 2, 3))
    for r in recompute:
        choice(fn, "recompute", r, RECOMPUTE)
    for sch in schedules:
        choice(fn, "schedules", sch, SCHEDULES)
    for mb in micro_batches:
        count(fn, "micro_batches", mb)

    results: list[Estimate] = []
    for point in layout_points(mdl, cl, n, gb, s, zero_stages=zero_stages, recompute=recompute,
                               micro_batches=micro_batches, schedules=schedules, max_cp=max_cp, strict_pp=strict_pp,
                               cp_within_node=cp_within_node):
        best = None
        for lay in point:
            est = _fastest_fit(mdl, cl, lay, gb, s, efficiency, dp_overlap, dtype, hbm_usable, partial_recompute)
            if est is not None and (best is None or est.step_time < best.step_time):
                best = est
        if best is not None:
            results.append(best)
    if not results:
        raise ValueError(f"{fn}: no layout of {mdl.name} fits on {n} x {cl.gpu.name} with global_batch={gb}, "
                         f"seq_len={s}")
    results.sort(key=lambda e: e.step_time)
    return results[:top]


def layout_points(mdl: ModelConfig, cl: ClusterSpec, n: int, gb: int, s: int, *,
                  zero_stages: tuple[int, ...] = (1, 2, 3), recompute: tuple[str | None, ...] = (None, "full"),
                  micro_batches: tuple[int, ...] = (1, 2, 4, 8),
                  schedules: tuple[str, ...] = ("1f1b", "interleaved", "zb-h1"), max_cp: int = 16,
                  strict_pp: bool = False, cp_within_node: bool = True):
    """The pruned grid: every point that passes the divisibility and topology filters, as the list of its
    ZeRO-stage variants (the planner keeps the fastest that fits). Order: tp, cp, pp, ep, micro-batch,
    schedule, recomputation."""
    L = mdl.layers
    for tp in _powers_of_two(cl.gpus_per_node):
        if mdl.heads % tp or (mdl.kv_heads % tp and tp % mdl.kv_heads):
            continue
        for cp in _powers_of_two(max_cp):
            if (s % (2 * cp) and cp > 1) or (cp_within_node and tp * cp > cl.gpus_per_node):
                continue
            for pp in range(1, L + 1):
                if n % (tp * cp * pp):
                    continue
                if strict_pp and L % pp:
                    continue
                if not strict_pp and math.ceil(L / pp) * (pp - 1) >= L:
                    continue  # some stage would be empty
                dp = n // (tp * cp * pp)
                if gb % dp:
                    continue
                for ep in (_powers_of_two(min(mdl.experts, dp)) if mdl.is_moe else [1]):
                    if dp % ep or mdl.experts % ep:
                        continue
                    for mb in micro_batches:
                        if (gb // dp) % mb:
                            continue
                        m = gb // (dp * mb)
                        for sched, v in _schedules(pp, m, math.ceil(L / pp), schedules):
                            for rc in recompute:
                                yield [Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, zero_stage=z, recompute=rc,
                                              micro_batch=mb, schedule=sched, virtual=v, sp=tp > 1)
                                       for z in sorted(zero_stages) if not (pp > 1 and z > 1)]


def _fastest_fit(mdl, cl, lay, gb, s, efficiency, dp_overlap, dtype, hbm_usable, partial):
    """The layout's estimate if it fits; for full recompute, the fewest recomputed layers per stage that fit
    (time grows and memory shrinks with each recomputed layer, so the first fit is the fastest)."""
    def run(x):
        return estimate_layout(mdl, cl, x, gb, s, efficiency, dp_overlap=dp_overlap, dtype=dtype,
                               hbm_usable=hbm_usable)

    if lay.recompute != "full" or not partial:
        est = run(lay)
        return est if est.fits else None
    per_stage = math.ceil(mdl.layers / lay.pp)
    full = run(lay)
    if not full.fits:
        return None
    lo, hi = 0, per_stage  # invariant: recomputing hi layers fits
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if run(replace(lay, recompute_layers=mid)).fits:
            hi = mid
        else:
            lo = mid
    return full if hi == per_stage else run(replace(lay, recompute_layers=hi))


def _schedules(pp: int, m: int, layers_per_stage: int, allowed: tuple[str, ...]):
    if pp == 1:
        yield "1f1b", 1
        return
    for sched in allowed:
        if sched == "interleaved":
            if m % pp:
                continue
            for v in (2, 4, 8):
                if v <= layers_per_stage and layers_per_stage % v == 0:
                    yield sched, v
        elif sched in ("gpipe", "1f1b", "zb-h1", "zb-h2", "dualpipe"):
            yield sched, 1


def format_table(estimates: list[Estimate], title: str = "") -> str:
    """A fixed-width table: layout, memory per GPU (GB) by category, step split (s), MFU."""
    head = (f"{'#':>2} {'tp':>2} {'cp':>2} {'pp':>3} {'dp':>5} {'ep':>3} {'Z':>1} {'recomp':>9} {'mb':>2} "
            f"{'schedule':>13} {'m':>4} | {'param':>5} {'grad':>5} {'optim':>5} {'activ':>5} {'buf':>4} "
            f"{'total':>5} GB | {'step':>6} {'comp':>6} {'comm':>6} {'bubble':>6} s | {'MFU':>5}")
    lines = [title, head, "-" * len(head)] if title else [head, "-" * len(head)]
    for i, e in enumerate(estimates, 1):
        x, mem = e.layout, {k: v / 1e9 for k, v in e.memory.items()}
        sched = (x.schedule + (f" v{x.virtual}" if x.virtual > 1 else "")) if x.pp > 1 else "-"
        lines.append(
            f"{i:>2} {x.tp:>2} {x.cp:>2} {x.pp:>3} {x.dp:>5} {x.ep:>3} {x.zero_stage:>1} {x.recompute_label():>9} "
            f"{x.micro_batch:>2} {sched:>13} {e.microbatches:>4} | {mem['params']:>5.1f} {mem['grads']:>5.1f} "
            f"{mem['optimizer']:>5.1f} {mem['activations']:>5.1f} {mem['buffers']:>4.1f} {mem['total']:>5.1f}    | "
            f"{e.step_time:>6.2f} {e.compute:>6.2f} {e.exposed_comm:>6.2f} {e.bubble:>6.2f}   | {e.mfu:>5.1%}")
    return "\n".join(lines)
