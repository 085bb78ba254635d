"""The measured device, checked on what it was fitted to and on what it was not (book ch2, ch32; lab 01).

Property: a model is validated where it was not fitted. ``md.hardware.fit_kernels`` fits a few numbers (a host
time and a fixed GPU cost per kernel, the fraction of peak a matrix product reaches, the fraction of HBM bandwidth
each kind of kernel reaches) to single kernels timed in a loop. The same GPU also ran whole training steps of a
GPT (forward, backward, AdamW), which the fit never sees: ``predict_train`` with ``Cluster(kernels="measured")``
against those steps is the test of the model, and ``kernels="roofline"`` beside it shows how far the ideal
device is from a real one.

``python -m minidist device`` prints both tables (``--data FILE`` for other measurements of the
same layout, ``--refit`` to store a new fit of the packaged H200 data).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minidist.hardware import kernels as K
from minidist.hardware.cluster import Cluster
from minidist.hardware.specs import gpu as gpu_named

H200 = "H200-141GB-SXM"


@dataclass(frozen=True)
class Row:
    """One measurement against the two device models (seconds)."""

    label: str
    measured: float
    predicted: float  # the measured device
    roofline: float  # the ideal device
    size: float = 0.0  # bytes the kernel moves (kernels only)

    @property
    def ratio(self) -> float:
        return self.predicted / self.measured


def kernel_rows(model: K.KernelModel | None = None, path: str | Path = K.DATA, gpu: str = H200) -> list[Row]:
    """Every measured kernel of ``path``: measured seconds, the model's (``KernelModel.seconds``: the kernel in a
    loop, as it was timed) and the roofline's."""
    model = K.measured_kernels() if model is None else model
    g = gpu_named(gpu)
    rows = []
    for m in K.load_measurements(path):
        peak = g.peak(m.fmt)
        args = (m.name, m.flops, m.nbytes, m.fmt, peak, g.hbm_bw, g.peak("fp32"), m.shape)
        rows.append(Row(m.label, m.seconds, model.seconds(*args), K.ROOFLINE.seconds(*args), m.nbytes))
    return rows


def step_rows(model: K.KernelModel | None = None, path: str | Path = K.DATA, gpu: str = H200,
              attention: str = "explicit") -> list[Row]:
    """Every measured GPT step of ``path`` (``gpt_steps``) against ``predict_train`` on one GPU of each device
    model: bf16 steps run 2-byte arrays charged at the bf16 peak, fp32 steps 4-byte arrays at the fp32 peak.
    ``attention="explicit"`` compares with the step whose attention was written out, as minidist computes it."""
    from minidist.estimate.predict import predict_train
    from minidist.nn import GPTConfig
    from minidist.parallel import ParallelConfig

    model = K.measured_kernels() if model is None else model
    rows = []
    for s in json.loads(Path(path).read_text()).get("gpt_steps", []):
        cfg = GPTConfig(vocab_size=s["vocab_size"], seq_len=s["seq_len"], d_model=s["d_model"],
                        n_layers=s["n_layers"], n_heads=s["n_heads"], d_ff=s["d_ff"], mlp=s.get("mlp", "gelu"))
        bf16 = s["dtype"] == "bfloat16"
        times = []
        for kernels in (model, "roofline"):
            cluster = Cluster(gpu, compute_dtype="bf16" if bf16 else None, kernels=kernels)
            times.append(predict_train(cfg, ParallelConfig(), s["batch"], cluster,
                                       dtype="float16" if bf16 else "float32").step_time)
        label = (f"GPT {s['dtype']} d{s['d_model']} L{s['n_layers']} s{s['seq_len']} b{s['batch']} "
                 f"V{s['vocab_size']}")
        rows.append(Row(label, s[f"seconds_{attention}_attention" if attention == "explicit"
                                 else "seconds_sdpa_flash"], times[0], times[1]))
    return rows


def summary(kernels: list[Row], steps: list[Row]) -> dict[str, float]:
    """Median and worst relative errors: every kernel, kernels of 1 MB or more, and the held-out steps."""
    err = lambda rows: np.abs([r.ratio - 1 for r in rows]) if rows else np.zeros(1)  # noqa: E731
    big = [r for r in kernels if r.size >= 1e6]
    return {"kernel_median": float(np.median(err(kernels))), "kernel_1mb_worst": float(np.max(err(big))),
            "step_median": float(np.median(err(steps))), "step_worst": float(np.max(err(steps)))}


def validate_device(model: K.KernelModel | None = None, path: str | Path = K.DATA, file=None) -> dict[str, float]:
    """Print the fit's parameters, every kernel and every GPT step with both device models; return ``summary``."""
    out = file or sys.stdout
    model = K.measured_kernels() if model is None else model
    kernels, steps = kernel_rows(model, path), step_rows(model, path)
    print(model, file=out)
    print(f"measured on: {model.source or path}", file=out)
    print(f"\n{'kernel':34} {'measured':>10} {'model':>10} {'ratio':>6} {'roofline':>10} {'ratio':>6}", file=out)
    for r in kernels:
        print(f"{r.label:34} {r.measured * 1e6:>8.1f}us {r.predicted * 1e6:>8.1f}us {r.ratio:>6.2f} "
              f"{r.roofline * 1e6:>8.1f}us {r.roofline / r.measured:>6.2f}", file=out)
    print("\nGPT training steps (not used by the fit), one GPU, attention written out:", file=out)
    print(f"{'step':44} {'measured':>9} {'model':>9} {'ratio':>6} {'roofline':>9} {'ratio':>6}", file=out)
    for r in steps:
        print(f"{r.label:44} {r.measured * 1e3:>7.2f}ms {r.predicted * 1e3:>7.2f}ms {r.ratio:>6.2f} "
              f"{r.roofline * 1e3:>7.2f}ms {r.roofline / r.measured:>6.2f}", file=out)
    s = summary(kernels, steps)
    print(f"\nkernels: median error {s['kernel_median']:.1%}, worst of 1 MB or more {s['kernel_1mb_worst']:.1%}; "
          f"steps: median error {s['step_median']:.1%}, worst {s['step_worst']:.1%}", file=out)
    return s


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--data", default=str(K.DATA), help="a measurement file laid out like h200_eager.json")
    ap.add_argument("--refit", action="store_true", help="fit the data and use that fit (stored when the data is "
                                                          "the packaged H200 file)")


def run(args: argparse.Namespace) -> None:
    """``python -m minidist device [--data FILE] [--refit]``: print ``validate_device``'s tables."""
    model = None
    if Path(args.data).resolve() != K.DATA.resolve():
        model = K.fit_kernels(K.load_measurements(args.data), name="fitted to " + Path(args.data).name,
                              source=args.data)
    elif args.refit:
        model = K.fit_kernels(K.load_measurements(), name="H200 eager (fitted)", source=K.H200_SOURCE)
        K.FIT.write_text(K.as_json(model))
        K.measured_kernels.cache_clear()
    validate_device(model, args.data)
