"""What one op costs on a device: the ideal roofline, or a GPU measured running eager PyTorch (book ch2, ch3a; lab 01).

Property: a kernel cannot beat its slowest resource, and a real one also pays for being a kernel. The ideal device
charges ``max(flops / peak, bytes / hbm_bw)`` per op, nothing else. The measured device splits each op into the
kernels an eager framework launches for it (``eager_kernels.py``: a matrix product's backward is two products;
attention written out is two batched products, the scale, the mask (a clone and a fill), softmax and the heads'
copies, nine kernels each way) and prices each kernel as

    on the GPU:  launch + max(flops / (eff_flops peak), bytes / (eff_bytes hbm_bw))
    on the host: host[kind], the CPU time to issue it (Python, the dispatcher, the launch call)

The host issues kernels one after another and the GPU runs them in order, so the two form a pipeline: the clock
keeps a host stream beside the compute stream, and a kernel starts when the GPU is free and the host has issued
it. Large kernels hide the host; small ones leave the GPU waiting for Python, which is why a small model reaches a
tiny fraction of the roofline on a real GPU.

The parameters mean something and are few: the fraction of peak FLOP/s a large matrix product reaches per format
(tensor cores are fed by tiles that never run at 100%), the fraction of HBM bandwidth each kind of kernel reaches
(a norm reads its rows twice; a softmax over rows too long for the registers reads them again), a vector-unit
ceiling for transcendental-heavy ops (GELU's erf, softmax's exp and the norms' reductions run in fp32 whatever the
storage format), a fixed GPU cost per kernel, an extra one per matrix product (its last, partial wave) and a
product's loss to a short inner dimension, and the host's time per kernel of each kind. ``fit_kernels`` fits them to
measurements (``measured_kernels()`` is the stored fit to ``data/h200_eager.json``: one H200, PyTorch eager, CUDA
events); ``md.profiling.validate_device`` (``python -m minidist device``) prints the fit against every measured
kernel and every measured GPT step, which the fit never sees. Other GPUs reuse the H200's fractions and fixed costs
with their own peaks and bandwidth: an assumption, stated wherever the model is printed.

What it leaves out, measured: a whole training step pays more host time per op than a loop of one kernel
(autograd, modules, the optimizer's Python), and written-out attention in bf16 ran about 1.5 times as long as its
kernels predict, so small and bf16 GPT steps come out 0.39-0.80 of their measured time (fp32 steps of width
1024-2048 within 3%); the measured step also took its loss in fp32 on bf16 logits, which the split, charging the
loss at the logits' format, leaves out (about 2 ms of a bf16 step with a 32768-word vocabulary).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

# the kernels an op becomes (re-exported: callers and lab 21 read them here)
from minidist.hardware.eager_kernels import (  # noqa: F401
    OPTIMIZER_KERNELS,
    ROW_IN_REGISTERS,
    TRANSCENDENTAL,
    split,
)
from minidist.hardware.specs import FORMAT_OF
from minidist.hardware.specs import gpu as gpu_named

KINDS = ("gemm", "elementwise", "activation", "norm", "softmax")
VECTOR_KINDS = ("activation", "norm", "softmax")  # priced by their FLOPs on the vector units too
DATA = Path(__file__).with_name("data") / "h200_eager.json"
# fit_kernels(load_measurements(DATA)), stored (python -m minidist device --refit)
FIT = DATA.with_name("h200_eager_fit.json")
# peak formats without a measured efficiency borrow the closest measured one
_FORMAT = {"fp32": "fp32", "tf32": "fp32", "bf16": "bf16", "fp16": "bf16", "fp8": "bf16"}


@dataclass(frozen=True)
class KernelModel:
    """How a device prices one op: ``ideal=True`` is the roofline; otherwise the measured parameters below."""

    name: str
    ideal: bool = False
    host: dict = field(default_factory=dict)  # seconds the host needs to issue one kernel, by kind
    launch: float = 0.0  # seconds every kernel costs on the GPU beyond its work
    gemm_launch: float = 0.0  # extra seconds of a matrix product (its partial last wave)
    gemm_efficiency: dict = field(default_factory=dict)  # fraction of the format's peak a large product reaches
    bandwidth: dict = field(default_factory=dict)  # fraction of HBM bandwidth each kind reaches
    vector: dict = field(default_factory=dict)  # fraction of the fp32 peak activations, norms, softmax compute at
    gemm_inner: float = 0.0  # a product of inner length k runs at k / (k + gemm_inner) of its efficiency
    long_rows: float = 1.0  # bytes a softmax over rows longer than ROW_IN_REGISTERS moves, per byte charged
    source: str = ""

    def kernels(self, name: str, flops: float, nbytes: float, fmt: str, peak: float, hbm_bw: float,
                fp32_peak: float, shape: tuple = ()) -> list[tuple[float, float]]:
        """``(host seconds, GPU seconds)`` of each kernel of the op ``name`` (``fmt``: the peak's format)."""
        if self.ideal:
            return [(0.0, max(flops / peak, nbytes / hbm_bw))]
        if not flops and not nbytes:
            return []  # a view: no kernel runs
        eff = self.gemm_efficiency[_FORMAT.get(fmt, "fp32")]
        out = []
        for kind, f, b, length in split(name, flops, nbytes, shape):
            if kind == "gemm":
                tiles = length / (length + self.gemm_inner) if length else 1.0
                gpu = self.launch + self.gemm_launch + max(f / (eff * tiles * peak),
                                                           b / (self.bandwidth["gemm"] * hbm_bw))
            else:
                if kind == "softmax" and length > ROW_IN_REGISTERS:
                    b = b * self.long_rows
                vector = f / (self.vector[kind] * fp32_peak) if kind != "elementwise" else f / (eff * peak)
                gpu = self.launch + max(vector, b / (self.bandwidth[kind] * hbm_bw))
            out.append((self.host[kind], gpu))
        return out

    def seconds(self, name: str, flops: float, nbytes: float, fmt: str, peak: float, hbm_bw: float,
                fp32_peak: float, shape: tuple = ()) -> float:
        """Seconds per op when the op runs back to back (what a benchmark loop of it measures): the host issues
        the next one while the GPU runs this one, so the slower of the two sets the pace."""
        ks = self.kernels(name, flops, nbytes, fmt, peak, hbm_bw, fp32_peak, shape)
        return max(sum(h for h, _ in ks), sum(g for _, g in ks)) if ks else 0.0

    def parameters(self) -> dict[str, float]:
        """The fitted numbers, flat (seconds and fractions)."""
        p = {"launch": self.launch, "gemm_launch": self.gemm_launch, "gemm_inner": self.gemm_inner,
             "long_rows": self.long_rows}
        p.update({f"vector_{k}": v for k, v in self.vector.items()})
        p.update({f"host_{k}": v for k, v in self.host.items()})
        p.update({f"gemm_efficiency_{k}": v for k, v in self.gemm_efficiency.items()})
        p.update({f"bandwidth_{k}": v for k, v in self.bandwidth.items()})
        return p

    def __repr__(self) -> str:
        if self.ideal:
            return "KernelModel('roofline': max(flops / peak, bytes / hbm_bw) per op, no fixed cost)"
        host = ", ".join(f"{k} {v * 1e6:.1f}" for k, v in self.host.items())
        bw = ", ".join(f"{k} {v:.2f}" for k, v in self.bandwidth.items())
        eff = ", ".join(f"{k} {v:.2f}" for k, v in self.gemm_efficiency.items())
        vec = ", ".join(f"{k} {v:.3f}" for k, v in self.vector.items())
        return (f"KernelModel({self.name!r}: host us/kernel {host}; GPU launch {self.launch * 1e6:.1f} us "
                f"(+{self.gemm_launch * 1e6:.1f} per product); products at {eff} of peak; HBM fraction {bw}; "
                f"vector ops at {vec} of the fp32 peak; inner length {self.gemm_inner:.0f} lost per product; "
                f"softmax rows over {ROW_IN_REGISTERS} move {self.long_rows:.2f}x)")


def peak_format(gpu, dtype_name: str) -> tuple[str, float]:
    """The peak format an op of ``dtype_name`` (a numpy dtype's name or a format: "bf16", "fp8", ...) is charged at on
    ``gpu``, and its FLOP/s; formats the GPU has no peak for (integers, booleans) run at the fp32 peak."""
    key = FORMAT_OF.get(dtype_name, dtype_name)
    if key not in gpu.peak_flops:
        key = "fp32"
    return key, gpu.peak(key)


ROOFLINE = KernelModel("roofline", ideal=True, source="the ideal device: max(flops / peak, bytes / hbm_bw)")


# -- measurements and the fit --------------------------------------------------------------------------------
_FORMATS = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}


@dataclass(frozen=True)
class Measurement:
    """One measured kernel as the autograd charges it: ``name``, FLOPs and bytes, the format, the shape, seconds."""

    name: str
    flops: float
    nbytes: float
    fmt: str
    shape: tuple
    seconds: float
    label: str = ""

    @property
    def kind(self) -> str:
        return split(self.name, self.flops, self.nbytes, self.shape)[0][0]

    @property
    def length(self) -> int:
        return split(self.name, self.flops, self.nbytes, self.shape)[0][3]


def load_measurements(path: str | Path = DATA) -> list[Measurement]:
    """The kernels of a measurement file laid out like ``data/h200_eager.json`` (``ops``: matmul, bmm_scores, add,
    gelu, layernorm, softmax; ``square_kernels``: gemm_bf16, add_fp32), each counted the way the autograd counts it
    (GELU and softmax charge their transcendental FLOPs; the file's own counts are the plain roofline's)."""
    data = json.loads(Path(path).read_text())
    out = []
    for o in data.get("ops", []):
        fmt, shape = _FORMATS[o["dtype"]], o["shape"]
        e = 2 if fmt in ("bf16", "fp16") else 4
        label = f"{o['op']} {o['dtype']} {'x'.join(map(str, shape))}"
        if o["op"] == "matmul":
            m, k, n = shape
            out.append(Measurement("matmul", 2 * m * k * n, e * (m * k + k * n + m * n), fmt, (1, m, k, n),
                                   o["seconds"], label))
        elif o["op"] == "bmm_scores":  # (batch, T, d): q (T, d) @ k^T (d, T) per batch entry
            b, t, d = shape
            out.append(Measurement("matmul", 2 * b * t * t * d, e * (2 * b * t * d + b * t * t), fmt, (b, t, d, t),
                                   o["seconds"], label))
        else:
            n = math.prod(shape)
            name, flops, moved = {"add": ("add", n, 3 * n), "gelu": ("gelu", (TRANSCENDENTAL + 7) * n, 2 * n),
                                  "layernorm": ("layer_norm", 8 * n, 2 * n),
                                  "softmax": ("softmax", (TRANSCENDENTAL + 3) * n, 2 * n)}[o["op"]]
            out.append(Measurement(name, flops, e * moved, fmt, tuple(shape), o["seconds"], label))
    for o in data.get("square_kernels", []):
        n = o["size"]
        if o["op"] == "gemm_bf16":
            out.append(Measurement("matmul", 2 * n**3, 6 * n * n, "bf16", (1, n, n, n), o["seconds"],
                                   f"square matmul bfloat16 {n}^3"))
        elif o["op"] == "add_fp32":
            out.append(Measurement("add", n, 12 * n, "fp32", (n,), o["seconds"], f"add float32 {n}"))
    return out


def _unpack(theta: np.ndarray, kinds: list[str], formats: list[str]) -> KernelModel:
    """Parameters from the fit's vector: logs of launch, gemm_launch, gemm_inner, long_rows - 1 and of the host
    time per kind, then logits of the bandwidth and vector fractions per kind and of the efficiency per format."""
    v, f = np.exp(theta), _fraction(theta)
    nk = len(kinds)
    host, bw, vec, eff = v[4:4 + nk], f[4 + nk:4 + 2 * nk], f[4 + 2 * nk:4 + 3 * nk], f[4 + 3 * nk:]
    return KernelModel("fit", launch=float(v[0]), gemm_launch=float(v[1]), gemm_inner=float(v[2]),
                       long_rows=float(1 + v[3]), host={k: float(x) for k, x in zip(kinds, host)},
                       bandwidth={k: float(x) for k, x in zip(kinds, bw)},
                       vector={k: float(x) for k, x in zip(kinds, vec) if k in VECTOR_KINDS},
                       gemm_efficiency={k: float(x) for k, x in zip(formats, eff)})


def _fraction(x: np.ndarray) -> np.ndarray:
    """A number in (0, 1) from any real: fractions fitted without a flat edge at 1 where the simplex stalls."""
    return 1 / (1 + np.exp(-x))


def _logit(f) -> np.ndarray:
    f = np.asarray(f, dtype=float)
    return np.log(f / (1 - f))


def _nelder_mead(f, x0: np.ndarray, iterations: int, step: float = 0.3) -> np.ndarray:
    """Minimise ``f`` from ``x0`` (Nelder and Mead's simplex: reflect, expand, contract, shrink)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] <= 1e-10 * abs(values[0]) + 1e-14:  # every vertex as good: converged
            break
        centre = np.mean(simplex[:-1], axis=0)
        reflected = centre + (centre - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centre + 2 * (centre - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centre + 0.5 * (simplex[-1] - centre)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex = [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex]
                values = [f(x) for x in simplex]
    return simplex[int(np.argmin(values))]


def fit_kernels(measurements: list[Measurement], gpu=None, name: str = "fit", source: str = "",
                rounds: int = 40) -> KernelModel:
    """Fit a ``KernelModel`` to ``measurements`` taken on ``gpu`` (an ``md.hardware.GPU``; default the H200):
    the parameters minimising the squared log error of every kernel's predicted time (one kernel in a loop, so
    the host and the GPU overlap as in ``KernelModel.seconds``). Kinds or formats absent from the measurements
    are absent from the model."""
    g = gpu_named("H200-141GB-SXM") if gpu is None else gpu
    if not measurements:
        raise ValueError("fit_kernels: no measurements")
    kinds = [k for k in KINDS if any(m.kind == k for m in measurements)]
    formats = sorted({_FORMAT.get(m.fmt, "fp32") for m in measurements})
    kind = np.array([kinds.index(m.kind) for m in measurements])
    fmt = np.array([formats.index(_FORMAT.get(m.fmt, "fp32")) for m in measurements])
    flops = np.array([m.flops for m in measurements], dtype=float)
    nbytes = np.array([m.nbytes for m in measurements], dtype=float)
    peak = np.array([g.peak(m.fmt) for m in measurements])
    seconds = np.array([m.seconds for m in measurements])
    gemm = np.array([m.kind == "gemm" for m in measurements])
    vec = np.array([m.kind in VECTOR_KINDS for m in measurements])
    fp32 = g.peak("fp32")
    nk, nf = len(kinds), len(formats)

    length = np.array([m.length for m in measurements], dtype=float)
    long_row = np.array([m.kind == "softmax" and m.length > ROW_IN_REGISTERS for m in measurements])

    def predict(theta: np.ndarray) -> np.ndarray:
        v, f = np.exp(theta), _fraction(theta)
        launch, gemm_launch, inner, long_rows = v[0], v[1], v[2], 1 + v[3]
        host, bw, vector, eff = v[4:4 + nk], f[4 + nk:4 + 2 * nk], f[4 + 2 * nk:4 + 3 * nk], f[4 + 3 * nk:]
        tiles = np.where(gemm & (length > 0), length / (length + inner), 1.0)
        work = np.where(vec, flops / (vector[kind] * fp32), flops / (eff[fmt] * tiles * peak))
        moved = np.where(long_row, nbytes * long_rows, nbytes)
        gpu_t = launch + gemm * gemm_launch + np.maximum(work, moved / (bw[kind] * g.hbm_bw))
        return np.maximum(host[kind], gpu_t)

    def loss(theta: np.ndarray) -> float:
        return float(np.sum(np.log(predict(theta) / seconds) ** 2))

    host0 = [seconds[kind == i].min() for i in range(nk)]
    bw0 = [{"gemm": 0.7, "norm": 0.5, "softmax": 0.5}.get(k, 0.85) for k in kinds]
    theta = np.concatenate([np.log([2e-6, 5e-6, 16.0, 0.5, *host0]), _logit([*bw0, *[0.1] * nk, *[0.75] * nf])])
    # the parameters split into blocks that touch few measurements: a product's, each other kind's, the launch
    blocks = []
    for i, k in enumerate(kinds):
        own = [4 + i, 4 + nk + i]
        if k == "gemm":
            own += [1, 2, *range(4 + 3 * nk, 4 + 3 * nk + nf)]
        if k in VECTOR_KINDS:
            own.append(4 + 2 * nk + i)
        if k == "softmax":
            own.append(3)
        blocks.append(own)
    blocks.append([0])
    best = loss(theta)
    for r in range(rounds):  # block by block, each a small simplex, until a whole round gains nothing
        first = r == 0
        for block in blocks:
            def sub(x: np.ndarray, block=block) -> float:
                t = theta.copy()
                t[block] = x
                return loss(t)

            starts = [theta[block]]
            if first:  # a vector kind may be bound by its arithmetic or by its bytes: start from both sides
                for guess in (0.02, 0.3):
                    start = theta[block].copy()
                    start[[j for j, b in enumerate(block) if 4 + 2 * nk <= b < 4 + 3 * nk]] = _logit(guess)
                    starts.append(start)
            found = [_nelder_mead(sub, x, 200 * len(block)) for x in starts]
            theta[block] = min(found, key=sub)
        now = loss(theta)
        if best - now < 1e-6 * best + 1e-12:  # (squared log errors: 1e-12 is a millionth of a percent)
            break
        best = now
    return replace(_unpack(theta, kinds, formats), name=name, source=source)


@functools.lru_cache(maxsize=1)
def measured_kernels() -> KernelModel:
    """The H200 fit (``data/h200_eager_fit.json``: ``fit_kernels`` on ``data/h200_eager.json``, stored so a rank
    does not refit; a test refits and compares)."""
    p = json.loads(FIT.read_text())
    return KernelModel(p["name"], host=p["host"], launch=p["launch"], gemm_launch=p["gemm_launch"],
                       gemm_efficiency=p["gemm_efficiency"], bandwidth=p["bandwidth"], vector=p["vector"],
                       gemm_inner=p["gemm_inner"], long_rows=p["long_rows"], source=p["source"])


def as_json(model: KernelModel) -> str:
    return json.dumps({"name": model.name, "source": model.source, "launch": model.launch,
                       "gemm_launch": model.gemm_launch, "vector": model.vector, "gemm_inner": model.gemm_inner,
                       "long_rows": model.long_rows, "host": model.host, "gemm_efficiency": model.gemm_efficiency,
                       "bandwidth": model.bandwidth}, indent=1) + "\n"


H200_SOURCE = ("one NVIDIA H200 (141 GB HBM3e), PyTorch 2.11 eager, CUDA events, 2026-11-27 "
               "(minidist/hardware/data/h200_eager.json)")

