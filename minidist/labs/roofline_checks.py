"""Checks for lab 01, the extended roofline."""

from __future__ import annotations

import math
from collections.abc import Callable

from minidist.labs.check import CheckFailed, attempt, check_cases, fail, learner_name, number, passed


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
