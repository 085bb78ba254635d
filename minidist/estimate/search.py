"""Searching the layout space with fewer evaluations than the grid, and the rules of thumb checked against it
(book ch27; lab 18).

Property: a layout's step time is nearly separable. The parallel degrees (tp, cp, pp, dp, ep) fix the
communication pattern and the bubble; the memory options (ZeRO stage, how much to recompute) and the
micro-batching only refine the time within what the degrees allow. So a **hierarchical search** ranks
each choice of degrees by one representative (the lowest ZeRO stage and the fewest recomputed layers that
fit, one sequence per micro-batch, 1F1B) and refines only the few best, instead of evaluating
every combination as the pruned grid does. An **evolutionary search** assumes only that good layouts
have good neighbours (one field changed) and spends its evaluations around the best it has seen.

Every method counts its evaluations of ``estimate_layout`` (the analytic model; on a real cluster each
would be a profiled trial run) and records when it first reached its final answer, so the methods can be
compared on the cost of reaching the grid's best.

``advise`` is the rule-based alternative: seven rules from the chapter's decision procedure (fit, keep the
GPUs busy, hide communication), each stated as a check on a layout. ``check_rules`` reports which rules a
layout (say, the search's winner) obeys, which is how the rules are tested: a rule the winners break is a
rule of thumb that fails there.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

from minidist.estimate._check import count
from minidist.estimate.calibrated import CALIBRATED
from minidist.estimate.clusters import ClusterSpec
from minidist.estimate.clusters import cluster as _cluster
from minidist.estimate.memory import model_state_bytes
from minidist.estimate.models import ModelConfig
from minidist.estimate.models import model as _model
from minidist.estimate.perf import Estimate, Layout, estimate_layout
from minidist.estimate.planner import layout_points


@dataclass
class SearchResult:
    """What a search found and what it cost: ``evaluations`` of the model, ``first_best_at`` the evaluation
    that first gave the final ``best``; ``trace[i]`` the best step time after i + 1 evaluations."""

    method: str
    best: Estimate | None
    evaluations: int
    first_best_at: int
    trace: list[float] = field(default_factory=list)


class _Evaluator:
    """``estimate_layout`` with a count, a cache (a layout evaluated twice costs once) and the running best."""

    def __init__(self, mdl: ModelConfig, cl: ClusterSpec, gb: int, s: int) -> None:
        self.mdl, self.cl, self.gb, self.s = mdl, cl, gb, s
        self.cache: dict[Layout, Estimate] = {}
        self.trace: list[float] = []
        self.best: Estimate | None = None
        self.best_at = 0

    def __call__(self, lay: Layout) -> Estimate | None:
        """The estimate if the layout fits, else None."""
        if lay not in self.cache:
            est = estimate_layout(self.mdl, self.cl, lay, self.gb, self.s, CALIBRATED)
            self.cache[lay] = est
            if est.fits and (self.best is None or est.step_time < self.best.step_time):
                self.best, self.best_at = est, len(self.cache)
            self.trace.append(self.best.step_time if self.best is not None else math.inf)
        est = self.cache[lay]
        return est if est.fits else None

    def fastest_fit(self, lay: Layout) -> Estimate | None:
        """With full recomputation, the fewest recomputed layers per stage that fit (bisection, as the planner)."""
        full = self(lay)
        if lay.recompute != "full" or full is None:
            return full
        lo, hi = 0, math.ceil(self.mdl.layers / lay.pp)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self(replace(lay, recompute_layers=mid)) is not None:
                hi = mid
            else:
                lo = mid
        return full if hi == math.ceil(self.mdl.layers / lay.pp) else self(replace(lay, recompute_layers=hi))

    def result(self, method: str) -> SearchResult:
        return SearchResult(method, self.best, len(self.cache), self.best_at, list(self.trace))


def _setup(fn, model, cluster, gpus, global_batch, seq_len):
    mdl = _model(model) if isinstance(model, str) else model
    cl = _cluster(cluster) if isinstance(cluster, str) else cluster
    n = count(fn, "gpus", gpus)
    gb = count(fn, "global_batch", mdl.global_batch if global_batch is None else global_batch)
    s = count(fn, "seq_len", mdl.seq_len if seq_len is None else seq_len)
    return mdl, cl, n, gb, s


def grid_search(model: ModelConfig | str, cluster: ClusterSpec | str, gpus: int, global_batch: int | None = None,
                seq_len: int | None = None) -> SearchResult:
    """Every point of the planner's pruned grid, every ZeRO stage, the fewest recomputed layers that fit."""
    mdl, cl, n, gb, s = _setup("grid_search", model, cluster, gpus, global_batch, seq_len)
    ev = _Evaluator(mdl, cl, gb, s)
    for point in layout_points(mdl, cl, n, gb, s):
        for lay in point:
            ev.fastest_fit(lay)
    return ev.result("grid")


def _degrees(lay: Layout) -> tuple[int, ...]:
    return lay.tp, lay.cp, lay.pp, lay.dp, lay.ep


def hierarchical_search(model: ModelConfig | str, cluster: ClusterSpec | str, gpus: int,
                        global_batch: int | None = None, seq_len: int | None = None, *, keep: int = 3
                        ) -> SearchResult:
    """Rank the parallel degrees by one representative each, then search the ``keep`` best exhaustively."""
    count("hierarchical_search", "keep", keep)
    mdl, cl, n, gb, s = _setup("hierarchical_search", model, cluster, gpus, global_batch, seq_len)
    ev = _Evaluator(mdl, cl, gb, s)
    groups: dict[tuple, list[Layout]] = {}
    for point in layout_points(mdl, cl, n, gb, s):
        groups.setdefault(_degrees(point[0]), []).extend(point)
    ranked = []
    for degrees, layouts in groups.items():
        tp, cp, pp, dp, ep = degrees
        rep = Layout(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, zero_stage=1, recompute="full", micro_batch=1,
                     schedule="1f1b", sp=tp > 1)
        if rep not in layouts:  # the batch does not split into micro-batches of one here: take its first point
            rep = replace(layouts[0], zero_stage=1, recompute="full")
        # the fastest ZeRO stage that fits: the least sharding is not always it, since ZeRO-2 reduce-scatters every
        # micro-batch while ZeRO-1 frees less memory for larger micro-batches
        fits = [ev.fastest_fit(replace(rep, zero_stage=z)) for z in ((1, 2, 3) if pp == 1 else (1,))]
        times = [e.step_time for e in fits if e is not None]
        if times:
            ranked.append((min(times), degrees))
    for _, degrees in sorted(ranked)[:keep]:
        for lay in groups[degrees]:
            ev.fastest_fit(lay)
    return ev.result("hierarchical")


def _neighbours(lay: Layout, space: list[Layout]) -> list[Layout]:
    """Layouts of the space that differ from ``lay`` in exactly one field."""
    fields = ("tp", "cp", "pp", "dp", "ep", "zero_stage", "recompute", "micro_batch", "schedule", "virtual")
    mine = [getattr(lay, f) for f in fields]
    out = []
    for other in space:
        diff = sum(a != getattr(other, f) for a, f in zip(mine, fields))
        if diff == 1 or (diff == 2 and other.dp != lay.dp):  # a degree moves together with dp (fixed GPUs)
            out.append(other)
    return out


def evolutionary_search(model: ModelConfig | str, cluster: ClusterSpec | str, gpus: int,
                        global_batch: int | None = None, seq_len: int | None = None, *, population: int = 12,
                        generations: int = 25, seed: int = 0) -> SearchResult:
    """A steady-state evolutionary search over the grid's layouts: start from ``population`` random layouts;
    each generation mutates the better half (a random neighbour: one field changed), keeps the fittest."""
    count("evolutionary_search", "population", population)
    count("evolutionary_search", "generations", generations)
    mdl, cl, n, gb, s = _setup("evolutionary_search", model, cluster, gpus, global_batch, seq_len)
    ev = _Evaluator(mdl, cl, gb, s)
    space = [lay for point in layout_points(mdl, cl, n, gb, s) for lay in point]
    rng = random.Random(seed)

    def score(lay: Layout) -> float:
        est = ev.fastest_fit(lay)
        return est.step_time if est is not None else math.inf

    pop = rng.sample(space, min(population, len(space)))
    scored = sorted((score(x), i, x) for i, x in enumerate(pop))
    for _ in range(generations):
        parents = [x for _, _, x in scored[: max(1, len(scored) // 2)]]
        children = []
        for parent in parents:
            near = _neighbours(parent, space)
            if near:
                children.append(rng.choice(near))
        merged = {x: t for t, _, x in scored}
        for child in children:
            merged.setdefault(child, score(child))
        scored = sorted((t, i, x) for i, (x, t) in enumerate(merged.items()))[:population]
    return ev.result("evolutionary")


# -- the rules of thumb ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    name: str
    statement: str


RULES = (
    Rule("tp-in-node", "tensor parallelism stays inside a node (tp <= GPUs per node)"),
    Rule("tp-before-pp", "fill the node with tp and cp before adding pipeline stages "
                         "(pp > 1 only with tp x cp >= min(GPUs per node, heads))"),
    Rule("no-pp-if-it-fits", "no pipeline when the model state, sharded by ZeRO-3 over all GPUs, leaves room"),
    Rule("enough-microbatches", "a pipeline gets at least 4 micro-batches per stage (bubble below 20%)"),
    Rule("zero1-with-pp", "with a pipeline, ZeRO-1 (gradients stay whole for accumulation)"),
    Rule("cp-only-for-long", "context parallelism only for sequences of 32K tokens or more"),
    Rule("recompute-only-if-needed", "recompute only what memory demands (the fewest layers that fit)"),
)


def check_rules(est: Estimate, model: ModelConfig | str, cluster: ClusterSpec | str) -> dict[str, bool]:
    """Which of the seven rules the layout of ``est`` obeys."""
    mdl = _model(model) if isinstance(model, str) else model
    cl = _cluster(cluster) if isinstance(cluster, str) else cluster
    x = est.layout
    state_fits = model_state_bytes(mdl.params, 3, x.gpus) < 0.5 * cl.gpu.hbm_bytes
    fewer = None
    if x.recompute == "full":
        done = x.recompute_layers if x.recompute_layers is not None else math.ceil(mdl.layers / x.pp)
        if done > 0:
            fewer = estimate_layout(mdl, cl, replace(x, recompute_layers=done - 1) if done > 1 else
                                    replace(x, recompute=None, recompute_layers=None), est.global_batch,
                                    est.seq_len, CALIBRATED)
    return {
        "tp-in-node": x.tp <= cl.gpus_per_node,
        "tp-before-pp": x.pp == 1 or x.tp * x.cp >= min(cl.gpus_per_node, mdl.heads),
        "no-pp-if-it-fits": not (state_fits and x.pp > 1),
        "enough-microbatches": x.pp == 1 or est.microbatches >= 4 * x.pp,
        "zero1-with-pp": x.pp == 1 or x.zero_stage <= 1,
        "cp-only-for-long": x.cp == 1 or est.seq_len >= 32768,
        "recompute-only-if-needed": fewer is None or not fewer.fits,
    }


def advise(model: ModelConfig | str, cluster: ClusterSpec | str, gpus: int, seq_len: int | None = None
           ) -> Layout:
    """The layout the rules alone pick, without timing anything: tp to the node (as far as the heads allow),
    a pipeline only if the model state does not fit, as few stages as make it fit, ZeRO-1, cp for long
    sequences, full recomputation (the planner then trims it to what memory demands)."""
    mdl, cl, n, _, s = _setup("advise", model, cluster, gpus, None, seq_len)
    tp = 1
    while tp * 2 <= cl.gpus_per_node and mdl.heads % (tp * 2) == 0 and n % (tp * 2) == 0:
        tp *= 2
    cp = 1
    while s >= 32768 * cp and tp * cp * 2 <= cl.gpus_per_node * 2 and n % (tp * cp * 2) == 0:
        cp *= 2
    pp = 1
    while model_state_bytes(mdl.params / (tp * pp), 1, max(1, n // (tp * cp * pp))) > 0.5 * cl.gpu.hbm_bytes and \
            n % (tp * cp * pp * 2) == 0 and pp * 2 <= mdl.layers:
        pp *= 2
    return Layout(tp=tp, cp=cp, pp=pp, dp=n // (tp * cp * pp), zero_stage=1, recompute="full", sp=tp > 1)
