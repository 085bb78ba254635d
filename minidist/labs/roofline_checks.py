"""Checks for lab 01, the extended roofline."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from minidist.labs.check import CheckFailed, _units, attempt, check_cases, fail, learner_name, number, passed


def check_matmul_intensity(fn: Callable[[int, int, int, int], float]) -> None:
    """``fn(m, n, k, b)`` must return 2mnk / (b (mk + kn + mn))."""

    def ref(m, n, k, b):
        return 2 * m * n * k / (b * (m * k + k * n + m * n))

    cases = [((1024, 1024, 1024, 2), ref(1024, 1024, 1024, 2), "a square bf16 matmul: 2n^3 FLOP over 3n^2 elements"),
             ((64, 4096, 4096, 2), ref(64, 4096, 4096, 2),
              "non-square: count A (m x k), B (k x n) and C (m x n) once each"),
             ((8, 8, 1, 4), ref(8, 8, 1, 4), "an outer product (k = 1): 2mn FLOP"),
             ((1, 4096, 4096, 4), ref(1, 4096, 4096, 4), "a matrix-vector product is memory-bound"),
             ((512, 256, 128, 4), ref(512, 256, 128, 4), "bytes_per_element multiplies every operand")]

    def diagnose(args, expected, got):
        if math.isclose(got, expected / 2, rel_tol=1e-9):
            return "off by a factor of 2: each multiply-add is 2 FLOP"
        if math.isclose(got, expected * args[3], rel_tol=1e-9) or math.isclose(got, expected * args[3] ** 2):
            return "intensity is FLOP per *byte*: multiply the element counts by bytes_per_element"
        return None

    check_cases("matmul_intensity", fn, cases, diagnose=diagnose)


def check_attainable(fn: Callable) -> None:
    """``fn(peak, mem_bw, i_mem, net_bw=None, i_net=None)`` is the minimum of the three ceilings."""
    peak, bw, net = 989e12, 3.35e12, 50e9
    cases = [((peak, bw, 10.0), bw * 10.0, "left of the ridge the memory line binds: BW * I"),
             ((peak, bw, 1e4), peak, "right of the ridge the flat peak binds"),
             ((peak, bw, peak / bw), peak, "at the ridge both are equal"),
             ((peak, bw, 1e4, net, 1e3), net * 1e3, "the network ceiling BW_net * I_net can bind alone"),
             ((peak, bw, 50.0, net, 1e5), bw * 50.0, "all three: take the minimum")]
    check_cases("attainable", fn, cases)
    try:
        got = fn(peak, bw, 1e4, None, None)
    except TypeError as e:
        fail("attainable without a network ceiling raised", peak, e, "net_bw and i_net default to None")
    if not math.isclose(got, peak):
        fail("attainable(peak, bw, 1e4) without a network", peak, got, "skip the network ceiling when it is None")


def check_dp_network_intensity(fn: Callable[[float, float, int, int], float]) -> None:
    """``fn(params, batch_tokens, gpus, bytes_per_grad)`` = (6 Psi B / P) / (2 Psi s) = 3B / (P s)."""

    def ref(psi, b, p, s):
        return (6 * psi * b / p) / (2 * psi * s)

    cases = [((7e9, 1e6, 64, 2), ref(7e9, 1e6, 64, 2),
              "book ch2 ex1: FLOPs/GPU = 6*Psi*B/P, bytes = 2*Psi*2; expect about 23,400"),
             ((7e9, 5e5, 64, 2), ref(7e9, 5e5, 64, 2), "halving the batch halves the intensity"),
             ((70e9, 4e6, 1024, 4), ref(70e9, 4e6, 1024, 4), "fp32 gradients: s = 4 bytes")]
    def diagnose(args, expected, got):
        psi, b, p, s = args
        if math.isclose(got, expected * p, rel_tol=1e-9):
            return "each GPU computes only its B / P tokens: divide the FLOPs by P"
        if math.isclose(got, expected / 3, rel_tol=1e-9):
            return "training is 6 Psi FLOPs per token (2 forward, 4 backward), not 2 Psi"
        if math.isclose(got, expected * p / (p - 1), rel_tol=1e-9):
            return "use the large-P ring volume 2 Psi s per GPU, without the (P - 1) / P factor"
        if math.isclose(got, expected * s, rel_tol=1e-9) or math.isclose(got, expected * 2, rel_tol=1e-9):
            return "the ring all-reduce sends about 2 Psi s bytes per GPU: 2 x Psi parameters x s bytes each"
        return None

    check_cases("dp_network_intensity", fn, cases, rel=1e-9, diagnose=diagnose)


def _judge_accumulation(a, compute_ms: float, comm_ms: float, where: str = "") -> int:
    want = math.ceil(comm_ms / compute_ms)
    if a is None:
        fail(f"accumulation steps{where}", want, None, "did you forget to `return` the number?")
    if isinstance(a, bool) or not isinstance(a, (int, float)) and not hasattr(a, "__int__") \
            or int(a) != a:
        fail(f"accumulation steps{where} must be a whole number", want, a, "you cannot run half a micro-batch")
    if a < want:
        hint = "with overlap the step takes max(a * compute, comm): you need a * compute >= comm"
        if a == math.floor(comm_ms / compute_ms):
            hint += ", so round comm / compute up (ceil), not down or to the nearest"
        fail(f"with that many micro-batches{where} the all-reduce is still longer than the compute", want, a, hint)
    if a > want:
        fail(f"that works{where}, but it is not the smallest", want, a,
             "every extra micro-batch grows the batch further")
    return want


def check_accumulation_steps(a, compute_ms: float | None = None, comm_ms: float | None = None) -> None:
    """The smallest integer a with a * compute >= comm (then overlap hides the all-reduce).

    ``a`` is either a function ``a(compute_ms, comm_ms)``, judged on several cases (one exact ratio alone cannot
    tell ceil from floor or round), or a number judged for the given ``compute_ms`` and ``comm_ms``.
    """
    if callable(a):
        cases = [(100.0, 200.0), (100.0, 250.0), (40.0, 100.0), (120.0, 100.0), (100.0, 100.0), (30.0, 200.0)]
        for compute, comm in cases:
            try:
                got = a(compute, comm)
            except NotImplementedError:
                raise CheckFailed("accumulation_steps: the exercise is not done yet "
                                  "(it raised NotImplementedError)") from None
            except Exception as e:
                raise CheckFailed(f"accumulation_steps({compute:g}, {comm:g}) raised {type(e).__name__}: {e}") from e
            _judge_accumulation(got, compute, comm, where=f" (compute {compute:g} ms, comm {comm:g} ms)")
        passed(f"accumulation_steps: {len(cases)} cases; e.g. {math.ceil(250 / 100)} micro-batches of 100 ms hide "
               "250 ms of comm")
        return
    want = _judge_accumulation(a, compute_ms, comm_ms)
    passed(f"accumulate {want} micro-batches: {want * compute_ms:.0f} ms of compute hides {comm_ms:.0f} ms of comm")


def _tiled(m: int, n: int, k: int, tile: int, b: int, *, output: bool = True, edges: bool = True) -> float:
    """FLOP per byte moved below the tile buffer: each block of C (at most tile x tile) streams its rows of A and
    its columns of B once through k and is written once (``output=False``/``edges=False``: usual slips)."""
    if edges:
        rows = [min(tile, m - i) for i in range(0, m, tile)]
        cols = [min(tile, n - j) for j in range(0, n, tile)]
    else:
        rows, cols = [tile] * math.ceil(m / tile), [tile] * math.ceil(n / tile)
    reads = sum(r * k + k * c for r in rows for c in cols)
    return 2 * m * n * k / (b * (reads + (m * n if output else 0)))


def check_tiled_intensity(fn: Callable[[int, int, int, int, int], float]) -> None:
    """``fn(m, n, k, tile, bytes_per_element)``: the arithmetic intensity of a matmul computed in tiles."""
    cases = [(256, 256, 256, 64, 4), (1024, 512, 2048, 128, 2), (300, 200, 100, 64, 4), (4096, 4096, 4096, 1, 2),
             (96, 4096, 512, 128, 2), (8192, 8192, 8192, 8192, 2), (1000, 1000, 1000, 96, 1)]
    name = learner_name(fn, "tiled_intensity")
    for m, n, k, tile, b in cases:
        got = attempt(name, fn, m, n, k, tile, b)
        got = number(f"{name}{(m, n, k, tile, b)}: expected a number", got)
        want = _tiled(m, n, k, tile, b)
        if math.isclose(got, want, rel_tol=1e-9):
            continue
        hint = ("count the bytes block by block: a block of C needs its rows of A and its columns of B, all k of "
                "them, once; then C is written once")
        if math.isclose(got, _tiled(m, n, k, tile, b, output=False), rel_tol=1e-9):
            hint = "the result is written too: m n elements of C go back to memory once"
        elif math.isclose(got, _tiled(m, n, k, tile, b, edges=False), rel_tol=1e-9):
            hint = "when the tile does not divide m or n the last blocks are smaller: they read only their own rows"
        elif math.isclose(got, 2 * m * n * k / (b * (m * k + k * n + m * n)), rel_tol=1e-9):
            hint = "that is the untiled ideal (every operand read once): with tiles, A and B are read again per block"
        fail(f"{name}{(m, n, k, tile, b)} is wrong", want, got, hint)
    passed(f"{name}: {len(cases)} matmuls, tiles that divide and tiles that do not")


# -- the extended roofline of a real GPU (section 3d) ----------------------------------------------------------

def _kernel_time(p: dict, gpu, kind: str, fmt: str, flops: float, nbytes: float, length: int = 0, *,
                 pipeline: str = "max", launch: bool = True, gemm_extra: bool = True, tiles: bool = True,
                 vector: bool = True, long_rows: bool = True) -> float:
    """Seconds per kernel run back to back on the measured device (``KernelModel.seconds`` for one kernel), from the
    flat parameters ``p``; the keywords switch off one piece each (the usual slips the check recognises)."""
    peak, eff = gpu.peak(fmt), p[f"gemm_efficiency_{fmt}"]
    if kind == "softmax" and length > 1024 and long_rows:
        nbytes = nbytes * p["long_rows"]
    memory = nbytes / (p[f"bandwidth_{kind}"] * gpu.hbm_bw)
    fixed = p["launch"] if launch else 0.0
    if kind == "gemm":
        share = length / (length + p["gemm_inner"]) if length and tiles else 1.0
        work = flops / (eff * share * peak)
        fixed += p["gemm_launch"] if gemm_extra else 0.0
    elif kind != "elementwise" and vector:
        work = flops / (p[f"vector_{kind}"] * gpu.peak("fp32"))
    else:
        work = flops / (eff * peak)
    on_gpu = fixed + max(work, memory)
    host = p[f"host_{kind}"]
    return {"max": max(host, on_gpu), "sum": host + on_gpu, "gpu": on_gpu}[pipeline]


def _kernel_cases():
    """(parameters, gpu, kind, fmt, flops, bytes, length, what): kernels the notebook does not print, on the fitted
    H200 and on a device whose host is ten times faster and whose launch is four times slower (so a model that
    hard-codes the H200's numbers, or drops either side, fails)."""
    from minidist.hardware import gpu as gpu_named
    from minidist.hardware import measured_kernels

    h200, h100 = gpu_named("H200-141GB-SXM"), gpu_named("H100-80GB-SXM")
    fit = measured_kernels().parameters()
    fast_host = dict(fit, launch=4 * fit["launch"], **{k: v / 10 for k, v in fit.items() if k.startswith("host_")})
    out = []
    for p, g, tag in ((fit, h200, "the H200 fit"), (fast_host, h100, "a faster host, a slower launch, an H100")):
        out += [(p, g, "gemm", "bf16", 2 * 6144 * 4096 * 12288, 2 * (6144 * 4096 + 4096 * 12288 + 6144 * 12288), 4096,
                 f"a large bf16 product (compute-bound), {tag}"),
                (p, g, "gemm", "bf16", 2 * 512 * 256 * 384, 2 * (512 * 256 + 256 * 384 + 512 * 384), 256,
                 f"a small bf16 product, {tag}"),
                (p, g, "gemm", "fp32", 2 * 4096 * 24 * 4096, 4 * (4096 * 24 + 24 * 4096 + 4096 * 4096), 24,
                 f"an fp32 product with inner length 24, {tag}"),
                (p, g, "gemm", "bf16", 2 * 8192 * 8192, 2 * (8192 * 8192 + 8192 + 8192), 8192,
                 f"a matrix-vector product (memory-bound), {tag}"),
                (p, g, "elementwise", "fp32", 3e8, 12 * 3e8, 0, f"a large fp32 add, {tag}"),
                (p, g, "elementwise", "bf16", 4096, 6 * 4096, 0, f"a tiny bf16 add, {tag}"),
                (p, g, "activation", "bf16", 11 * 2**27, 4 * 2**27, 0, f"a large bf16 GELU (its erf binds), {tag}"),
                (p, g, "norm", "fp32", 8 * 2**26, 8 * 2**26, 0, f"an fp32 layer norm, {tag}"),
                (p, g, "softmax", "bf16", 7 * 2**26, 4 * 2**26, 512, f"a softmax over rows of 512, {tag}"),
                (p, g, "softmax", "fp32", 7 * 2**28, 8 * 2**28, 8192, f"a softmax over rows of 8192, {tag}")]
    return out


def check_kernel_time(fn: Callable) -> None:
    """``fn(p, gpu, kind, fmt, flops, nbytes, length)``: seconds per kernel run back to back on the measured device,
    from the flat parameters ``p`` of ``md.hardware.measured_kernels().parameters()`` (or any such dict)."""
    name = learner_name(fn, "kernel_time")
    slips = [({"pipeline": "sum"}, "host and GPU work at the same time: while the GPU runs one kernel the host "
                                   "issues the next, so in a loop the slower of the two sets the pace (a max, "
                                   "not a sum)"),
             ({"pipeline": "gpu"}, "the host needs host_<kind> seconds to issue every kernel; a kernel shorter than "
                                   "that waits for Python"),
             ({"launch": False}, "every kernel pays the fixed `launch` on the GPU before its work"),
             ({"gemm_extra": False}, "a matrix product pays `gemm_launch` on top of `launch`"),
             ({"tiles": False}, "a product of inner length `length` runs at length / (length + gemm_inner) of its "
                                "efficiency"),
             ({"vector": False}, "activations, norms and softmax compute at vector_<kind> of the *fp32* peak, "
                                 "whatever the storage format"),
             ({"long_rows": False}, "a softmax over rows longer than 1024 moves long_rows times its bytes")]
    for p, g, kind, fmt, flops, nbytes, length, what in _kernel_cases():
        args = (p, g, kind, fmt, flops, nbytes, length)
        shown = f"{name}(p, {g.name}, {kind!r}, {fmt!r}, flops={flops:.4g}, nbytes={nbytes:.4g}, length={length})"
        got = number(f"{shown}: expected seconds", attempt(name, fn, *args, shown=shown))
        want = _kernel_time(*args)
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        hint = next((h for kw, h in slips if math.isclose(got, _kernel_time(*args, **kw), rel_tol=1e-6)), None)
        if hint is None and math.isclose(got, max(flops / g.peak(fmt), nbytes / g.hbm_bw), rel_tol=1e-6):
            hint = "that is the ideal roofline: use the fitted fractions, the launch and the host time in p"
        fail(f"{shown} is wrong ({what})", want, got, hint or _units(got, want) or
             "on the GPU: launch (+ gemm_launch for a product) + the longer of the work and the bytes, each at its "
             "fitted fraction; on the host: host_<kind>; then combine the two as a loop of kernels does")
    passed(f"{name}: {len(_kernel_cases())} kernels of every kind, on two devices")


def _half_work(host: float, launch: float, efficiency: float, *, slip: str = "") -> float:
    """The roofline time t of the smallest kernel reaching half its roofline rate in a loop, where one kernel takes
    max(host, launch + t / efficiency); inf when efficiency <= 1/2 (``slip``: the usual mistakes)."""
    if slip == "no_host":
        return launch / (2 - 1 / efficiency)
    if slip == "sum":
        return (host + launch) / (2 - 1 / efficiency)
    if slip == "no_efficiency":
        return max(host / 2, launch)
    if slip == "host_whole":
        return max(host, launch / (2 - 1 / efficiency))
    if efficiency <= 0.5:
        return math.inf
    return max(host / 2, launch / (2 - 1 / efficiency))


def check_half_roofline_work(fn: Callable[[float, float, float], float]) -> None:
    """``fn(host, launch, efficiency)``: the roofline time of the smallest kernel that reaches half of its roofline
    rate when run back to back (math.inf if none does)."""
    name = learner_name(fn, "half_roofline_work")
    cases = [(30e-6, 6e-6, 0.8, "a host-bound device: the host sets the knee"),
             (2e-6, 10e-6, 0.9, "a fast host: the GPU's launch sets the knee"),
             (0.0, 3e-6, 1.0, "no host cost, full efficiency"),
             (4e-6, 5e-6, 0.6, "an efficiency close to one half"),
             (1e-5, 1e-6, 0.5, "at exactly half the efficiency"),
             (1e-5, 1e-6, 0.35, "an efficiency below one half")]
    slips = {"no_host": "the host needs `host` seconds per kernel too: a kernel shorter than that waits for it",
             "sum": "host and GPU overlap in a loop: one kernel takes max(host, GPU time), not their sum",
             "no_efficiency": "the work runs at `efficiency` of the roofline's rate: the GPU spends t / efficiency "
                              "on it, on top of the launch",
             "host_whole": "half the roofline rate means the kernel may take *twice* its roofline time"}
    for host, launch, eff, what in cases:
        shown = f"{name}({host:g}, {launch:g}, {eff:g})"
        want = _half_work(host, launch, eff)
        never = ("a kernel whose work runs at no more than half the roofline's rate never reaches half of it, "
                 "however large: return math.inf")
        got = attempt(name, fn, host, launch, eff, shown=shown, hint=never if math.isinf(want) else "")
        if math.isinf(want):
            if got is None or isinstance(got, (bool, str)) or np.ndim(got) or not math.isinf(float(got)):
                fail(f"{shown} is wrong ({what})", math.inf, got, never)
            continue
        got = number(f"{shown}: expected seconds", got)
        if math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-18):
            continue
        hint = next((h for s, h in slips.items() if math.isclose(got, _half_work(host, launch, eff, slip=s),
                                                                   rel_tol=1e-9)), None)
        fail(f"{shown} is wrong ({what})", want, got, hint or _units(got, want) or
             "write one kernel's time in a loop as a function of its roofline time t, and ask when it is 2 t")
    passed(f"{name}: {len(cases)} devices, host-bound, launch-bound and never")
