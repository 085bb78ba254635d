"""Command line: ``python -m minidist <command> ...``.

Commands are registered in ``COMMANDS`` (name -> (add_arguments, run)); another layer adds one by
appending a pair, and ``main`` builds an argparse subparser for each. Today:

- ``plan``: best layouts of a named model on a named cluster (md.estimate.plan), as a table.
- ``models``: the named model and cluster configurations with their sources.
- ``calibration``: the performance model against published runs, those it was fitted on and those it was not.
- ``device``: the measured device's kernel model against the kernels and training steps it was measured on.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def _plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="named model, e.g. llama3_405b (see `models`)")
    p.add_argument("--gpus", type=int, required=True, help="number of GPUs")
    p.add_argument("--cluster", default="dgx-h100", help="dgx-a100, dgx-h100 or h800")
    p.add_argument("--batch", type=int, default=None, help="global batch in sequences (default: the published one)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: the model's)")
    p.add_argument("--top", type=int, default=10, help="how many layouts to print")
    p.add_argument("--dp-overlap", type=float, default=0.8, help="fraction of the DP reduction hidden by backward")


def _plan_run(args: argparse.Namespace) -> int:
    """best layouts of a named model on a named cluster"""
    import time

    from minidist import estimate as E

    m, c = E.model(args.model), E.cluster(args.cluster)
    t0 = time.perf_counter()
    best = E.plan(m, c, args.gpus, args.batch, args.seq, top=args.top, dp_overlap=args.dp_overlap)
    dt = time.perf_counter() - t0
    gb, s = best[0].global_batch, best[0].seq_len
    print(f"{m.name} ({m.params / 1e9:.0f}B params, {m.active_params / 1e9:.0f}B active) on {args.gpus} x "
          f"{c.gpu.name} ({c.name}); global batch {gb} x {s} tokens; searched in {dt:.2f} s")
    print("memory in GB per GPU (fullest stage); step split in seconds; MFU = 6 Psi tokens / (time GPUs peak)")
    print(E.format_table(best))
    if m.published_layout:
        print(f"published layout: {m.published_layout}")
    print(f"the top layout, as the trainer takes it (the same mesh; the trainer's dp excludes ep):\n  "
          f"{runnable_config(best[0])}")
    return 0


def runnable_config(estimate) -> str:
    """``md.parallel.ParallelConfig(...)`` for a planned layout, naming only the fields that differ from the
    defaults: pasted into a notebook it runs the layout (on a model small enough for the simulator)."""
    import dataclasses

    from minidist.parallel import ParallelConfig

    pc = ParallelConfig.from_layout(estimate)
    fields = [f"{f.name}={getattr(pc, f.name)!r}" for f in dataclasses.fields(pc)
              if f.init and getattr(pc, f.name) != f.default]
    return f"md.parallel.ParallelConfig({', '.join(fields)})"


def _models_args(p: argparse.ArgumentParser) -> None:
    del p


def _models_run(args: argparse.Namespace) -> int:
    """list the named models and clusters with their sources"""
    from minidist import estimate as E

    for name, m in sorted(E.MODELS.items()):
        print(f"{name:18} {m.params / 1e9:8.1f}B  L={m.layers:<4} h={m.hidden:<6} heads={m.heads:<4} "
              f"experts={m.experts:<4} | {m.source[:90]}")
    for name, c in sorted(E.CLUSTERS.items()):
        print(f"{name:18} {c.gpus_per_node} x {c.gpu.name}, intra {c.intra.beta / 1e9:.0f} GB/s, "
              f"inter {c.inter.beta / 1e9:.0f} GB/s per GPU, ${c.usd_per_gpu_hour}/GPU-h")
    return 0


def _calibration_args(p: argparse.ArgumentParser) -> None:
    del p


def _calibration_run(args: argparse.Namespace) -> int:
    """the performance model against published runs (fitted on, then held out)"""
    from minidist import estimate as E
    from minidist.estimate import calibration

    eff = E.CALIBRATED
    print(f"Fitted on Megatron 2021 Table 1 (A100, fp16, full recomputation): gemm = {eff.gemm}, "
          f"overhead_bytes = {eff.overhead_bytes:g}")
    print(f"  {'run':34} {'published':>10} {'predicted':>10} {'error':>7}")
    for model, row in calibration.megatron_rows():
        pred = calibration.predict_megatron_tflops(model, row)
        print(f"  {row['id']:34} {row['published']:>10.0f} {pred:>10.1f} {pred / row['published'] - 1:>+7.1%}"
              f"   TFLOP/s per GPU")
    print("Held out (not fitted): each run's published layout, or the planner's where none is published")
    print(calibration.held_out_table(calibration.held_out()))
    return 0


COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "plan": (_plan_args, _plan_run),
    "models": (_models_args, _models_run),
    "calibration": (_calibration_args, _calibration_run),
}


def _device_args(p: argparse.ArgumentParser) -> None:
    from minidist.profiling.measured_device import add_arguments

    add_arguments(p)


def _device_run(args: argparse.Namespace) -> int:
    """the measured device's kernel model against the kernels and GPT steps it was measured on"""
    from minidist.profiling.measured_device import run

    run(args)
    return 0


COMMANDS["device"] = (_device_args, _device_run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minidist", description="minidist command line")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (add_args, _) in COMMANDS.items():
        add_args(sub.add_parser(name, help=(COMMANDS[name][1].__doc__ or name)))
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command][1](args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
