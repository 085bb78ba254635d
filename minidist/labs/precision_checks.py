"""Checks for lab 21, reduced precision (book chapter 30): a format's largest number, rounding to nearest
even with subnormals, the dynamic loss-scaling rule, each against ``md.precision``, and the time of a
mixed-precision step against the charges of ``md.parallel.train(precision=...)``, on the ideal device and, kernel
by kernel, on the measured one (``Cluster(kernels="measured")``)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from minidist.labs.check import attempt, check_cases, fail, number, passed
from minidist.precision import FORMATS, Format, cast, representable


def check_max_finite(fn: Callable[[int, int, bool], float]) -> None:
    """``fn(exponent_bits, mantissa_bits, ieee)``: the largest finite number of the format."""
    # formats the notebook never prints: the page's table shows fp32, bf16, fp16, E4M3 and E5M2
    rng = np.random.default_rng(21)
    named = {(8, 23, True), (8, 7, True), (5, 10, True), (4, 3, False), (5, 2, True)}
    drawn = [(int(e), int(m), bool(i)) for e, m, i in zip(rng.integers(3, 12, 40), rng.integers(1, 24, 40),
                                                         rng.integers(0, 2, 40))]
    shapes = [(4, 3, True), (5, 2, False), (3, 2, True)] + [s for s in dict.fromkeys(drawn) if s not in named][:9]
    cases = [((e, m, ieee), Format("f", e, m, ieee).max, "all mantissa bits set, at the largest exponent")
             for e, m, ieee in shapes]

    def diagnose(args, expected, got):
        e, m, ieee = args
        bias = 2 ** (e - 1) - 1
        if not ieee and np.isclose(got, (2 - 2.0**-m) * 2.0 ** (2**e - 1 - bias)):
            return "E4M3 keeps the all-ones exponent for numbers but spends S.1111.111 on NaN: drop that last pattern"
        if not ieee and np.isclose(got, (2 - 2.0**-m) * 2.0 ** (2**e - 2 - bias)):
            return "without infinities the all-ones exponent holds numbers too (only its top mantissa is NaN)"
        if np.isclose(got, 2.0 ** (2**e - 2 - bias)) or np.isclose(got, 2.0 ** (2**e - 1 - bias)):
            return "the largest number has every mantissa bit set: (2 - 2^-m) x 2^emax, not just 2^emax"
        if np.isclose(got, (2 - 2.0**-m) * 2.0 ** (2**e - 1 - bias)):
            return "IEEE formats reserve the all-ones exponent for infinities and NaN: emax = 2^e - 2 - bias"
        return None

    check_cases("max_finite", fn, cases, rel=1e-12, diagnose=diagnose)


def check_round_to(fn: Callable[[np.ndarray, int, int], np.ndarray]) -> None:
    """``fn(x, mantissa_bits, min_exponent)``: ``x`` rounded to the nearest number with that many mantissa bits
    (ties to even), subnormals below ``2^min_exponent``; overflow is not asked for."""
    rng = np.random.default_rng(0)
    for name in ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2"):
        f = FORMATS[name]
        v = representable(f) if f.bits <= 16 else np.zeros(0)
        v = v[~np.signbit(v) & (v < f.max)]  # one zero: -0.0 and +0.0 would make 0.0 look like a tie
        mids = (v[:-1] + v[1:]) / 2
        wide = rng.standard_normal(2000) * np.exp2(rng.integers(f.min_exponent - f.mantissa_bits - 1,
                                                                f.max_exponent, 2000))
        x = np.concatenate([v[:4000], mids[:4000], -mids[:4000], wide[np.abs(wide) < f.max]])
        want = cast(x, f)
        got = attempt("round_to", fn, x.copy(), f.mantissa_bits, f.min_exponent,
                      shown=f"round_to(x of shape {x.shape}, {f.mantissa_bits}, {f.min_exponent}) ({name})")
        got = np.asarray(got, dtype=np.float64)
        if got.shape != x.shape:
            fail(f"round_to(x of shape {x.shape}, {f.mantissa_bits}, {f.min_exponent}) ({name})", x.shape, got.shape,
                 "round elementwise: the result has the shape of x")
        # A zero's sign is not asked for: sign(x) x round(|x| / q) x q is as right as round(x / q) x q.
        bad = np.flatnonzero(~((got == want) & ((want == 0) | (np.signbit(got) == np.signbit(want)))))
        if len(bad):
            i = bad[0]
            tie = bool(np.isin(abs(x[i]), mids))
            neighbour = abs(abs(got[i] - want[i]) - 2 * abs(x[i] - want[i])) <= 1e-300  # the other side of a tie
            sub = abs(x[i]) < 2.0**f.min_exponent
            hint = ("a tie goes to the neighbour whose last mantissa bit is 0: np.round rounds halves to even, "
                    "np.floor(x + 0.5) does not" if tie and neighbour else
                    "below 2^min_exponent the spacing stays 2^(min_exponent - mantissa_bits): clamp the exponent"
                    if sub else "the spacing in the binade of x is 2^(floor(log2|x|) - mantissa_bits)")
            fail(f"round_to({float(x[i])!r}, {f.mantissa_bits}, {f.min_exponent}) ({name}, {len(bad)} of {len(x)} "
                 "wrong)",
                 float(want[i]), float(got[i]), hint)
    passed("round_to: fp16, bf16, E4M3 and E5M2, every tie included")


def _scaler(scale: float, found_inf: bool, clean: int, growth_interval: int) -> tuple[float, int, bool]:
    if found_inf:
        return scale / 2, 0, False
    clean += 1
    if clean == growth_interval:
        return scale * 2, 0, True
    return scale, clean, True


def check_loss_scale_update(fn: Callable[[float, bool, int, int], tuple]) -> None:
    """``fn(scale, found_inf, clean_steps, growth_interval) -> (scale, clean_steps, step)``."""
    rng = np.random.default_rng(2130)  # scales, counts and intervals the page does not show
    cases = [(2.0**16, False, 0, 3), (2.0**10, True, 0, 1000), (1.0, False, 999, 1000), (8.0, False, 0, 1)]
    for _ in range(12):
        n = int(rng.integers(1, 50))
        cases.append((2.0 ** int(rng.integers(-4, 30)), bool(rng.random() < 0.3), int(rng.integers(0, n)), n))
    cases += [(2.0**7, False, n - 1, n) for n in (5, 17)]
    for args in cases:
        want = _scaler(*args)
        got = attempt("loss_scale_update", fn, *args)
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            fail(f"loss_scale_update{args}", want, got, "return the tuple (scale, clean_steps, step)")
        if tuple(got) != want:
            scale, inf, clean, n = args
            if inf:
                hint = "an overflow halves the scale, restarts the count of clean steps, and skips the update"
            elif got[2] is False:
                hint = "a step without overflow is taken"
            else:
                hint = f"after {n} clean steps in a row the scale doubles and the count starts again"
            fail(f"loss_scale_update{args}", want, got, hint)
    passed(f"loss_scale_update: {len(cases)} cases")


# How md.parallel.train charges an op of a float32 run under each precision: (bytes per element, peak) for the
# matrix products and for the other ops; the optimizer's update of the fp32 master copy keeps fp32 throughout.
_CHARGES = {"fp32": ((4, "fp32"), (4, "fp32")), "bf16": ((2, "bf16"), (2, "bf16")),
            "fp16": ((2, "fp16"), (2, "fp16")), "fp8": ((1, "fp8"), (2, "bf16"))}


def _step_time(ops, precision, gpu, charges=_CHARGES, optimizer_fp32=True, combine=max) -> float:
    total = 0.0
    for name, flops, nbytes in ops:
        kind = "fp32" if optimizer_fp32 and name == "optimizer.step" else precision
        size, peak = charges[kind][0 if name.startswith("matmul") else 1]
        total += combine(flops / gpu.peak(peak), nbytes * size / 4 / gpu.hbm_bw)
    return total


_NAMES = ("matmul", "matmul.backward", "softmax", "layer_norm.backward", "gelu", "add", "embedding",
          "scaled_dot_product_attention", "cross_entropy", "optimizer.step")


def _ops(rng: np.random.Generator, n: int) -> list[tuple[str, float, float]]:
    """A float32 run's compute events: products from memory-bound to compute-bound, cheap elementwise ops."""
    ops = []
    for _ in range(n):
        name = _NAMES[int(rng.integers(len(_NAMES)))]
        nbytes = 4.0 * float(rng.integers(1, 64)) * 2.0 ** int(rng.integers(12, 24))
        intensity = 2.0 ** rng.uniform(3, 11) if name.startswith("matmul") else 2.0 ** rng.uniform(-3, 2)
        ops.append((name, float(np.floor(nbytes * intensity)), nbytes))
    return ops


def check_step_time(fn: Callable[[list, str, object], float]) -> None:
    """``fn(ops, precision, gpu)``: simulated seconds of the ops of a float32 run, each ``(name, flops, bytes)``,
    charged as ``md.parallel.train(precision=...)`` charges them ("fp32": as they are)."""
    from minidist.hardware.specs import gpu as gpu_named

    rng = np.random.default_rng(2131)
    trials = [(_ops(rng, int(rng.integers(1, 30))), p, g) for g in ("H100-80GB-SXM", "A100-80GB-SXM")
              for p in ("fp32", "bf16", "fp16", "fp8") if not (p == "fp8" and g.startswith("A100"))
              for _ in range(3)]
    trials.insert(0, ([("optimizer.step", 0.0, 4e6), ("gelu", 1e6, 8e6)], "bf16", "H100-80GB-SXM"))
    trials.insert(0, ([("matmul", 2e12, 6e8)], "fp8", "H100-80GB-SXM"))
    wrong = {
        "the format also shrinks the tensors an op reads and writes: a memory-bound op gains as much as a product":
            dict(charges={k: ((4, a[1]), (4, b[1])) for k, (a, b) in _CHARGES.items()}),
        "the optimizer updates the fp32 master copy and its moments: that op keeps fp32's bytes and peak":
            dict(optimizer_fp32=False),
        "in the fp8 recipe only the products take 1-byte operands at fp8's peak; the other ops stay in bf16":
            dict(charges={**_CHARGES, "fp8": ((1, "fp8"), (1, "fp8"))}),
        "fp8 products read 1-byte operands, not bf16's 2":
            dict(charges={**_CHARGES, "fp8": ((2, "fp8"), (2, "bf16"))}),
        "the arithmetic and the memory traffic of one op overlap: it lasts as long as the slower of the two":
            dict(combine=lambda a, b: a + b),
    }
    for ops, precision, name in trials:
        g = gpu_named(name)
        want = _step_time(ops, precision, g)
        shown = f"step_time(<{len(ops)} ops>, {precision!r}, {name})"
        got = number(shown, attempt("step_time", fn, ops, precision, g, shown=shown))
        if not np.isclose(got, want, rtol=1e-9, atol=0):
            hint = next((h for h, kw in wrong.items() if np.isclose(got, _step_time(ops, precision, g, **kw),
                                                                     rtol=1e-9, atol=0)), None)
            if hint is None and np.isclose(got, want * 1e6, rtol=1e-6):
                hint = "give seconds, not microseconds"
            fail(f"{shown} with ops {ops[:3]}{' ...' if len(ops) > 3 else ''}", want, got,
                 hint or "charge each op by the roofline, with the bytes per element and the peak its kind has "
                         "in the recipe")
    passed(f"step_time: {len(trials)} op lists on H100 and A100")


# -- the same step on a measured GPU ----------------------------------------------------------------------------
def _measured_step(kernels, precision, gpu, km, charges=_CHARGES, optimizer_fp32=True, vector_fp32=True,
                   launch=True, tiles=True, efficiency=True, bandwidth=True, host="pipeline") -> float:
    """Seconds of an fp32 run's kernels ``(op, kind, flops, bytes, inner)`` under ``precision`` on the measured
    device ``km`` (``hardware/kernels.py``); the switches turn off one idea each, for the hints."""
    issued = clock = 0.0
    for op, kind, flops, nbytes, inner in kernels:
        which = "fp32" if optimizer_fp32 and op == "optimizer.step" else precision
        size, fmt = charges[which][0 if op.startswith("matmul") else 1]
        nbytes = nbytes * size / 4
        eff = km.gemm_efficiency["fp32" if fmt == "fp32" else "bf16"] if efficiency else 1.0
        moved = nbytes / ((km.bandwidth[kind] if bandwidth else 1.0) * gpu.hbm_bw)
        fixed = (km.launch + (km.gemm_launch if kind == "gemm" else 0.0)) if launch else 0.0
        if kind == "gemm":
            share = inner / (inner + km.gemm_inner) if tiles and inner else 1.0
            work = flops / (eff * share * gpu.peak(fmt))
        elif kind in km.vector:
            work = flops / (km.vector[kind] * gpu.peak("fp32")) if vector_fp32 else flops / (eff * gpu.peak(fmt))
        else:
            work = flops / (eff * gpu.peak(fmt))
        seconds = fixed + max(work, moved)
        if host == "pipeline":  # the host issues kernel after kernel; the GPU starts one once it is free and issued
            issued += km.host[kind]
            clock = max(clock, issued) + seconds
        elif host == "serial":  # the host waits for each kernel before issuing the next
            clock += km.host[kind] + seconds
        elif host == "per kernel":  # each kernel alone, as a benchmark loop of it runs
            clock += max(km.host[kind], seconds)
        else:
            clock += seconds
    return clock


_KERNEL_KINDS = (("matmul", "gemm"), ("matmul.backward", "gemm"), ("scaled_dot_product_attention", "gemm"),
                 ("scaled_dot_product_attention", "softmax"), ("scaled_dot_product_attention.backward", "elementwise"),
                 ("layer_norm", "norm"), ("layer_norm.backward", "norm"), ("gelu", "activation"),
                 ("gelu.backward", "activation"), ("add", "elementwise"), ("mul.backward", "elementwise"),
                 ("cross_entropy", "softmax"), ("embedding", "elementwise"), ("optimizer.step", "elementwise"))


def _kernel_list(rng: np.random.Generator, n: int, scale: int) -> list[tuple[str, str, float, float, int]]:
    """An fp32 run's kernels: products with inner lengths from 16 to 4096, vector kernels on either side of
    their ceiling, and sizes from a few microseconds of host to milliseconds of GPU (``scale``: log2 of the
    largest tensor's elements)."""
    out = []
    for _ in range(n):
        op, kind = _KERNEL_KINDS[int(rng.integers(len(_KERNEL_KINDS)))]
        nbytes = 4.0 * float(rng.integers(1, 16)) * 2.0 ** int(rng.integers(scale - 10, scale))
        if kind == "gemm":
            intensity, inner = 2.0 ** rng.uniform(1, 10), int(2 ** rng.integers(4, 13))
        else:
            intensity, inner = (2.0 ** rng.uniform(-1.5, 1.5) if kind in ("norm", "activation", "softmax")
                                else 2.0 ** rng.uniform(-4, -1)), 0
        out.append((op, kind, float(np.floor(nbytes * intensity)), nbytes, inner))
    return out


def _other_device(rng: np.random.Generator, km):
    """``km`` with every fitted number moved by up to a factor of two: an answer must read the model's fields."""
    from dataclasses import replace

    def move(v, cap=None):
        x = v * 2.0 ** rng.uniform(-1, 1)
        return min(x, cap) if cap else x

    return replace(km, launch=move(km.launch), gemm_launch=move(km.gemm_launch), gemm_inner=move(km.gemm_inner),
                   host={k: move(v) for k, v in km.host.items()},
                   gemm_efficiency={k: move(v, 0.95) for k, v in km.gemm_efficiency.items()},
                   bandwidth={k: move(v, 0.95) for k, v in km.bandwidth.items()},
                   vector={k: move(v, 0.5) for k, v in km.vector.items()}, name="another fit")


def check_measured_step_time(fn: Callable[[list, str, object, object], float]) -> None:
    """``fn(kernels, precision, gpu, km)``: simulated seconds of an fp32 run's kernels, each ``(op, kind, flops,
    bytes, inner)``, run under ``precision`` on the measured device ``km`` (``md.hardware.measured_kernels()`` or
    another fit), as ``md.parallel.train(precision=..., cluster=md.Cluster(gpu, kernels=km))`` charges them."""
    from minidist.hardware.kernels import measured_kernels
    from minidist.hardware.specs import gpu as gpu_named

    rng = np.random.default_rng(2132)
    fitted = measured_kernels()
    trials = [([("matmul", "gemm", 2e12, 6e8, 4096)], "fp8", "H200-141GB-SXM", fitted),
              ([("layer_norm", "norm", 4e8, 4e8, 0), ("optimizer.step", "elementwise", 1e6, 8e7, 0)], "bf16",
               "H200-141GB-SXM", fitted)]
    for name in ("H200-141GB-SXM", "H100-80GB-SXM"):
        for p in ("fp32", "bf16", "fp16", "fp8"):
            for scale in (14, 26):  # host-bound lists and GPU-bound ones
                km = fitted if rng.random() < 0.5 else _other_device(rng, fitted)
                trials.append((_kernel_list(rng, int(rng.integers(2, 40)), scale), p, name, km))
    wrong = {
        "the host issues the next kernel while the GPU runs this one: keep the time up to which the host has "
        "issued (km.host[kind] per kernel, one after another) and start each kernel at the later of that and the "
        "end of the previous kernel": dict(host="serial"),
        "the GPU cannot start a kernel before the host has issued it: add the host's running time, km.host[kind] "
        "per kernel, and start each kernel at the later of the GPU being free and the host having issued it":
            dict(host="none"),
        "a kernel timed alone in a loop costs max(host, GPU), but in a step the host runs ahead while a long kernel "
        "runs: keep one running time for the host and one for the GPU": dict(host="per kernel"),
        "every kernel pays km.launch on the GPU before its work, and a product km.gemm_launch more: fixed costs "
        "that no format shrinks": dict(launch=False),
        "norms, softmax and activations compute on the vector units at km.vector[kind] of the fp32 peak whatever "
        "format they store: their arithmetic does not speed up in bf16": dict(vector_fp32=False),
        "a product of inner length k reaches only k / (k + km.gemm_inner) of its efficiency":
            dict(tiles=False),
        "a product reaches km.gemm_efficiency of its format's peak, never the whole peak": dict(efficiency=False),
        "each kind of kernel reaches km.bandwidth[kind] of the HBM bandwidth, not all of it": dict(bandwidth=False),
        "the optimizer updates the fp32 master copy and its moments: its kernels keep fp32's bytes and peak":
            dict(optimizer_fp32=False),
        "in the fp8 recipe only the products take 1-byte operands at fp8's peak; the other ops stay in bf16":
            dict(charges={**_CHARGES, "fp8": ((1, "fp8"), (1, "fp8"))}),
        "fp8 products read 1-byte operands, not bf16's 2": dict(charges={**_CHARGES, "fp8": ((2, "fp8"), (2, "bf16"))}),
        "the format also shrinks the bytes every kernel moves, not only the products' peak":
            dict(charges={k: ((4, a[1]), (4, b[1])) for k, (a, b) in _CHARGES.items()}),
    }
    for kernels, precision, name, km in trials:
        g = gpu_named(name)
        want = _measured_step(kernels, precision, g, km)
        shown = f"measured_step_time(<{len(kernels)} kernels>, {precision!r}, {name}, <{km.name}>)"
        got = number(shown, attempt("measured_step_time", fn, list(kernels), precision, g, km, shown=shown,
                                    hint="a KeyError on km.gemm_efficiency? fp16 and fp8 were never measured: "
                                         "they borrow bf16's fraction"))
        if not np.isclose(got, want, rtol=1e-9, atol=0):
            hint = next((h for h, kw in wrong.items()
                         if np.isclose(got, _measured_step(kernels, precision, g, km, **kw), rtol=1e-9, atol=0)),
                        None)
            if hint is None and np.isclose(got, want * 1e6, rtol=1e-6):
                hint = "give seconds, not microseconds"
            fail(f"{shown} with kernels {kernels[:2]}{' ...' if len(kernels) > 2 else ''}", want, got,
                 hint or "price each kernel by its kind (a fixed cost, then the slower of its arithmetic at the "
                         "fraction of peak its kind reaches and its bytes at its fraction of the bandwidth), with "
                         "the bytes and format the recipe gives its op, and let the host issue them in order")
    passed(f"measured_step_time: {len(trials)} kernel lists, host-bound and GPU-bound, on H200 and H100, the fitted "
           "device and others")
