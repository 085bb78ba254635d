"""A published run three ways: simulated op by op, predicted by the closed-form estimator, and as reported.

``side_by_side("llama3_405b")`` times one step of the model on its published layout with
``md.parallel.at_scale.simulate_step`` (every op and message of one rank per pipeline stage, shape-only) on each
device model (the ideal roofline, and kernels priced as a GPU running eager PyTorch runs them), evaluates
``md.estimate.estimate_layout`` on the same layout twice (with the GEMM efficiency fitted to Megatron-LM's
measurements, and with GEMMs at peak as the simulator charges them), and puts the published throughput beside them.
Where the rows differ, the difference has a cause that can be named: the lab (24) and
``minidist/estimate/README.md`` name them for LLaMA 3 405B.
"""

from __future__ import annotations

from dataclasses import replace

from minidist.estimate import CALIBRATED, Layout, cluster, estimate_layout, model, plan
from minidist.hardware.cluster import Cluster
from minidist.parallel import ParallelConfig
from minidist.parallel.at_scale import ScaleStep, gpt_config, model_flops_per_token, simulate_step
from minidist.profiling import run_budget

TERMS = ("compute (forward, backward, recomputation)", "pipeline wait (bubble, stage hand-offs)",
         "exposed collectives", "idle")


def step_terms(step: ScaleStep) -> dict[str, float]:
    """Where the step went on its slowest simulated GPU (the one whose step is the step's length; of those, the
    busiest): seconds of compute, of waiting for a pipeline neighbour (the bubble: a blocking receive of activations
    or gradients, or its send), of collectives the program waited for (tensor, data or expert parallel), and idle.
    The terms sum to the step (``md.profiling.step_budget``)."""
    if step.result is None:
        raise ValueError("step_terms: the step has no trace (simulate_step keeps it in .result)")
    b = max(run_budget(step.result), key=lambda b: (round(b.total, 12), b.compute))
    out = dict.fromkeys(TERMS, 0.0)
    for k, v in b.parts.items():
        if k.startswith("compute:"):
            out[TERMS[0]] += v
        elif k.startswith(("exposed:recv", "exposed:send", "exposed:irecv", "exposed:isend")):
            out[TERMS[1]] += v
        elif k.startswith("exposed:"):
            out[TERMS[2]] += v
        else:
            out[TERMS[3]] += v
    return out


def published_parallel(name: str, **overrides) -> tuple[ParallelConfig, int]:
    """The published layout of model ``name`` as a ``ParallelConfig`` and the published global batch in sequences.
    What the paper leaves open is set as Megatron-LM would run it: one sequence per micro-batch, sequence
    parallelism with TP, ZeRO-1 (Megatron-LM's distributed optimizer), every layer recomputed (what fits
    here: this autograd keeps more activations than Meta's kernels), 4 interleaved chunks per GPU (126 layers
    leave 64 chunks of 2 layers or fewer); with expert parallelism (DeepSeek-V3: ``ep`` 64 of the published
    ``dp`` 128, so ``ParallelConfig.dp`` 2) DualPipeV, the published schedule; ``overrides`` change any of them."""
    m = model(name)
    pub = m.published_layout
    if not pub:
        raise ValueError(f"side_by_side: {name} has no published layout")
    batch = pub.get("global_batch", m.global_batch)
    dp = pub["dp"]
    # Megatron-LM's gradient buckets: max(40M, 1M x dp) elements of 2 bytes (its DDP default)
    fields = dict(tp=pub["tp"], pp=pub["pp"], dp=dp, cp=pub.get("cp", 1), microbatches=batch // dp,
                  sequence_parallel=pub["tp"] > 1, zero_stage=1, recompute="full", schedule="interleaved",
                  virtual_stages=4, bucket_bytes=2 * max(40e6, 1e6 * dp))
    if pub.get("ep", 1) > 1:
        fields.update(ep=pub["ep"], dp=dp // pub["ep"], schedule="dualpipev", virtual_stages=1)
    fields.update(overrides)
    if fields["pp"] == 1:
        fields.update(schedule="1f1b", virtual_stages=1)
    return ParallelConfig(**fields), batch


def layout_of(pc: ParallelConfig, global_batch: int) -> Layout:
    """The estimator's description of ``pc`` (attention scores materialised, as the simulator's attention does)."""
    return Layout(tp=pc.tp, pp=pc.pp, dp=pc.dp * pc.ep, cp=pc.cp, ep=pc.ep, zero_stage=pc.zero_stage,
                  recompute=pc.recompute, micro_batch=global_batch // (pc.dp * pc.ep * pc.microbatches),
                  schedule=pc.schedule, virtual=pc.virtual_stages, sp=pc.sequence_parallel, flash=False,
                  recompute_layers=pc.recompute_layers)


def planned_parallel(name: str, gpus: int, cluster_name: str = "dgx-h100") -> tuple[ParallelConfig, int]:
    """The planner's best layout for model ``name`` on ``gpus`` GPUs as a ``ParallelConfig``, and its batch."""
    top = plan(name, cluster_name, gpus)[0]
    return ParallelConfig.from_layout(top), top.global_batch


def side_by_side(name: str = "llama3_405b", parallel: ParallelConfig | None = None,
                 global_batch: int | None = None, cluster_name: str = "dgx-h100", gpus: int | None = None,
                 kernels: tuple[str, ...] = ("roofline", "measured")) -> list[dict]:
    """Rows ``{"source", "step_time", "mfu", "tflops_per_gpu", "memory"}`` (seconds, fraction, TFLOP/s, bytes on
    the fullest GPU or None): the simulator on each device model of ``kernels`` (with ``terms``, its step split by
    ``step_terms``), the estimator calibrated and at peak, and the published figures.
    The layout: ``parallel`` (with ``global_batch``), else the planner's best on ``gpus``, else the published one.
    ``mfu`` counts ``6 N`` FLOPs per token in every row, ``tflops_per_gpu`` adds attention's (the published
    convention), so the published step time is the one its TFLOP/s imply."""
    m = model(name)
    if parallel is not None:
        pc, batch = parallel, global_batch
    elif gpus is not None:
        pc, batch = planned_parallel(name, gpus, cluster_name)
    else:
        pc, batch = published_parallel(name)
    if batch is None:
        raise ValueError("side_by_side: give global_batch with a layout of your own")
    spec = cluster(cluster_name)
    rows = []
    for device in kernels:
        sim = simulate_step(gpt_config(m), pc, batch, cluster=Cluster(kernels=device))
        what = "ideal roofline" if device == "roofline" else "kernels as eager PyTorch runs them"
        rows.append(dict(source=f"simulated, {what}: {sim.simulated_ranks} of {sim.gpus} ranks run",
                         step_time=sim.step_time, mfu=sim.mfu, tflops_per_gpu=sim.tflops_per_gpu,
                         memory=sim.peak_memory, wall_seconds=sim.wall_seconds, compute_time=sim.compute_time,
                         breakdown=sim.breakdown, terms=step_terms(sim), kernels=device))
    lay = layout_of(pc, batch)
    for label, eff in ((f"estimator, GEMMs at {CALIBRATED.gemm:.0%} of peak (fitted to Megatron-LM)", CALIBRATED),
                       ("estimator, GEMMs at peak (as the simulator charges them)", replace(CALIBRATED, gemm=1.0))):
        e = estimate_layout(m, spec, lay, batch, m.seq_len, eff)
        rows.append(dict(source=label, step_time=e.step_time, mfu=e.mfu, tflops_per_gpu=e.tflops_per_gpu,
                         memory=e.memory["total"]))
    pub = m.published_layout
    if "tflops_per_gpu" in pub and pub.get("gpus") == pc.world_size:
        six_n, with_attention = model_flops_per_token(sim.model, sim.num_params)
        step = with_attention * batch * m.seq_len / (pc.world_size * pub["tflops_per_gpu"] * 1e12)
        # reported as 400 TFLOP/s and "41% MFU" counting attention; the MFU column counts 6 N per token everywhere
        rows.append(dict(source="published", step_time=step, mfu=six_n * batch * m.seq_len / (
            step * pc.world_size * spec.gpu.peak("bf16")), tflops_per_gpu=float(pub["tflops_per_gpu"]), memory=None))
    return rows


def print_side_by_side(rows: list[dict]) -> None:
    """The rows as a table, then each simulated row's step split into its terms."""
    print(f"{'':72s} {'s/step':>7s} {'MFU 6N':>7s} {'TFLOP/s':>8s} {'GB':>6s}")
    for r in rows:
        mem = "" if r["memory"] is None else f"{r['memory'] / 1e9:6.1f}"
        print(f"{r['source']:72s} {r['step_time']:7.2f} {r['mfu']:7.1%} {r['tflops_per_gpu']:8.0f} {mem:>6s}")
    simulated = [r for r in rows if "terms" in r]
    if simulated:
        print(f"\n{'seconds of the step on its slowest GPU':44s}" + "".join(f" {r['kernels']:>10s}" for r in simulated))
        for term in TERMS:
            print(f"{term:44s}" + "".join(f" {r['terms'][term]:10.3f}" for r in simulated))
