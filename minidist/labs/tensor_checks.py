"""Checks for lab 09, tensor parallelism (chapter 15): column- and row-parallel ``Y = XW``, the Megatron
MLP with a single all-reduce, and the per-layer communication formula.

The sharded functions run on 2 and 4 simulated ranks; a wrong answer names the rank and recognises
the usual mistakes (a dense fallback, the other axis, the bias added on every rank, a missing or an
extra collective).
"""

from __future__ import annotations

import math

import numpy as np

from minidist.labs.check import check_cases, fail, passed
from minidist.labs.ranks import run_ranks


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (the one GPT-2 and minidist use)."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _data(seed: int = 0, n: int = 3, k: int = 8, m: int = 12):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, k)), rng.normal(size=(k, m)), rng.normal(size=m)


class Counted(np.ndarray):
    """An array that counts the multiply-adds of every matrix product it takes part in.

    Values alone cannot tell a rank that multiplies its own block of W from one that multiplies all
    of W and then slices the answer: both return the right numbers. The check hands the weights in as
    ``Counted`` arrays (slices of them stay ``Counted``) and compares each rank's count with the
    1/p share of the dense product. A product taken after ``np.asarray`` goes uncounted, which the
    check treats as "cannot tell", never as a failure.
    """

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = [a.view(np.ndarray) if isinstance(a, Counted) else a for a in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(a.view(np.ndarray) if isinstance(a, Counted) else a for a in kwargs["out"])
        result = getattr(ufunc, method)(*plain, **kwargs)
        if ufunc is np.matmul and method == "__call__":
            _count(plain[0], plain[1])
        return result

    def __array_function__(self, func, types, args, kwargs):
        if func is np.dot:
            _count(args[0], args[1])
        return super().__array_function__(func, types, args, kwargs)  # the plain implementation: no re-dispatch


_MACS: dict[int, int] = {}  # rank -> multiply-adds of products with a Counted operand (ranks may be threads)


def _count(a, b) -> None:
    from minidist import dist

    a, b = np.asarray(a), np.asarray(b)
    if a.ndim >= 1 and b.ndim >= 1:
        inner = a.shape[-1]
        rows = math.prod(a.shape[:-1])
        cols = b.shape[-1] if b.ndim >= 2 else 1
        rank = dist.get_rank()
        _MACS[rank] = _MACS.get(rank, 0) + rows * inner * cols


def _counted(a: np.ndarray) -> Counted:
    return np.array(a).view(Counted)


def _call(fn, *args):
    from minidist import dist

    t0 = dist.now()
    _MACS.pop(dist.get_rank(), None)
    out = fn(*args)
    return None if out is None else np.asarray(out, dtype=float), t0, _MACS.pop(dist.get_rank(), None)


def _check_share(name: str, p: int, macs: list, dense: int, hint: str) -> None:
    """Fail if a rank's products cost the dense layer's (not its 1/p share); unknown counts pass."""
    for r, m in enumerate(macs):
        if m is not None and m > 1.25 * dense / p:
            fail(f"{name} on {p} ranks: rank {r} multiplied more than its share of the weights "
                 f"(multiply-adds)", f"{dense // p} (1/{p} of the dense layer's {dense})", m, hint)


def _run(name: str, fn, world: int, args: list):
    """Run ``fn(*args[rank])`` on ``world`` ranks. Returns (outputs, trace)."""
    def body():
        from minidist import dist

        return _call(fn, *args[dist.get_rank()])

    res = run_ranks(name, body, world, timeout=20)
    outs = [o[0] for o in res]
    for r, o in enumerate(outs):
        if o is None:
            fail(f"{name} on {world} ranks: rank {r} returned nothing", "an array", None,
                 "did you forget to `return` the result?")
    return outs, res.trace, [o[2] for o in res]


def _collectives(trace, rank: int = 0) -> list[str]:
    return [e.name for e in trace if e.rank == rank and e.stream == "comm"]


def check_column_parallel(fn) -> None:
    """``fn(x, w, b)`` with the full X, W, b on every rank returns this rank's block of columns of X W + b."""
    for p in (2, 4):
        x, w, b = _data(p)
        y = x @ w + b
        outs, trace, macs = _run("column_parallel_linear", fn, p, [(x, _counted(w), b)] * p)
        k = w.shape[1] // p
        for r, got in enumerate(outs):
            want = y[:, r * k:(r + 1) * k]
            if got.shape == y.shape:
                fail(f"column_parallel_linear on {p} ranks: rank {r} returned all of Y", want.shape, got.shape,
                     "that is the dense layer: each rank keeps only its m/p columns of W (and of b) and computes "
                     "only those outputs")
            if got.shape != want.shape:
                fail(f"column_parallel_linear on {p} ranks: rank {r} returned the wrong shape", want.shape, got.shape,
                     "rank r owns columns r*m/p ... (r+1)*m/p - 1 of W: w[:, lo:hi]")
            if np.allclose(got, y[:, r * k:(r + 1) * k] - b[r * k:(r + 1) * k]):
                fail(f"column_parallel_linear on {p} ranks: rank {r} forgot the bias", want[0, :3], got[0, :3],
                     "add this rank's block of b: b[lo:hi]")
            if not np.allclose(got, want, rtol=1e-10, atol=1e-12):
                fail(f"column_parallel_linear on {p} ranks: rank {r} holds the wrong block", want[0, :3], got[0, :3],
                     "use the block of columns that belongs to md.dist.get_rank(), in rank order")
        if _collectives(trace):
            fail(f"column_parallel_linear on {p} ranks communicated", "no collective", _collectives(trace),
                 "each output column depends only on X and its own column of W: no communication is needed")
        _check_share("column_parallel_linear", p, macs, x.shape[0] * w.shape[0] * w.shape[1],
                     "the right columns sliced out of the full product X W: the point is that a rank never "
                     "computes the other ranks' columns. Slice W first, then multiply")
    passed("column_parallel_linear: each rank computes its own columns, no communication (2 and 4 ranks)")


def check_row_parallel(fn) -> None:
    """``fn(x_block, w, b)``: this rank's columns of X, the full W and b; returns the whole X W + b on every rank."""
    for p in (2, 4):
        x, w, b = _data(10 + p)
        y = x @ w + b
        k = x.shape[1] // p
        outs, trace, _ = _run("row_parallel_linear", fn, p,
                              [(x[:, r * k:(r + 1) * k].copy(), w, b) for r in range(p)])
        for r, got in enumerate(outs):
            if got.shape != y.shape:
                fail(f"row_parallel_linear on {p} ranks: rank {r} returned the wrong shape", y.shape, got.shape,
                     "take rows lo:hi of W (the ones that meet this rank's columns of X): w[lo:hi, :]")
            if np.allclose(got, y + (p - 1) * b):
                fail(f"row_parallel_linear on {p} ranks: the bias was counted {p} times", y[0, :3], got[0, :3],
                     "add b once, after the all-reduce (adding it on every rank before the sum adds it p times)")
            partial = x[:, r * k:(r + 1) * k] @ w[r * k:(r + 1) * k]
            if np.allclose(got, partial + b) or np.allclose(got, partial):
                fail(f"row_parallel_linear on {p} ranks: rank {r} returned only its partial sum", y[0, :3],
                     got[0, :3], "X W = sum over ranks of X_r W_r: all-reduce the partial sums with md.dist.all_reduce")
            if not np.allclose(got, y, rtol=1e-10, atol=1e-12):
                fail(f"row_parallel_linear on {p} ranks: rank {r} got a wrong Y", y[0, :3], got[0, :3],
                     "rank r's columns of X meet rows lo:hi of W with lo = r * k/p")
        n_ar = _collectives(trace).count("all_reduce")
        if n_ar != 1:
            fail(f"row_parallel_linear on {p} ranks: number of all-reduces", 1, n_ar,
                 "one all-reduce of the (n, m) partial sums is all it takes")
    passed("row_parallel_linear: partial sums, one all-reduce, the bias added once (2 and 4 ranks)")


def check_megatron_mlp(fn) -> None:
    """``fn(x, w1, b1, w2, b2)`` on every rank (full arrays) returns ``gelu(x w1 + b1) w2 + b2`` with one all-reduce."""
    for p in (2, 4):
        rng = np.random.default_rng(20 + p)
        x, w1, b1 = rng.normal(size=(3, 6)), rng.normal(size=(6, 16)), rng.normal(size=16)
        w2, b2 = rng.normal(size=(16, 6)), rng.normal(size=6)
        want = gelu(x @ w1 + b1) @ w2 + b2
        outs, trace, macs = _run("megatron_mlp", fn, p, [(x, _counted(w1), b1, _counted(w2), b2)] * p)
        for r, got in enumerate(outs):
            if got.shape != want.shape:
                fail(f"megatron_mlp on {p} ranks: rank {r}'s result has the wrong shape", want.shape, got.shape,
                     "every rank returns the whole output x W1 W2 (batch x d_model), the all-reduce's sum")
            if not np.allclose(got, want, rtol=1e-10, atol=1e-12):
                wrong = gelu(x @ w1 + b1) @ w2 + p * b2
                hint = ("the second bias was added on every rank" if np.allclose(got, wrong) else
                        "column-parallel first layer, GELU on the local block (elementwise, so no communication), "
                        "row-parallel second layer, then the all-reduce")
                fail(f"megatron_mlp on {p} ranks: rank {r}", want[0, :3], got.reshape(-1)[:3], hint)
        names = _collectives(trace)
        if names != ["all_reduce"]:
            fail(f"megatron_mlp on {p} ranks: collectives on rank 0", ["all_reduce"], names,
                 "GELU acts on each hidden feature separately, so the column blocks need not be gathered: "
                 "only the row layer's partial sums are reduced")
        _check_share("megatron_mlp", p, macs, x.shape[0] * (w1.shape[0] * w1.shape[1] + w2.shape[0] * w2.shape[1]),
                     "each rank multiplies only its columns of W1 and its rows of W2; computing a full layer and "
                     "slicing its answer gives the right numbers at p times the work")
    passed("megatron_mlp: column -> GELU -> row with a single all-reduce (2 and 4 ranks)")


def _ref_bytes(b, s, h, t, d):
    return 4 * 2 * (t - 1) / t * b * s * h * d


def _ref_time(b, s, h, t, alpha, beta, d):
    return 4 * (2 * (t - 1) * alpha + 2 * (t - 1) / t * b * s * h * d / beta)


def check_tp_layer_bytes(layer_bytes) -> None:
    """``layer_bytes(b, s, h, t, dtype_bytes)``: bytes one GPU sends per layer and micro-batch (forward and
    backward, ring all-reduces)."""

    cases = [((1, 4096, 8192, 8, 2), "4 all-reduces per layer (2 forward, 2 backward) of b s h values"),
             ((4, 2048, 4096, 2, 2), "a ring all-reduce of n bytes sends 2 (t-1)/t n per GPU"),
             ((2, 1024, 1024, 4, 4), "dtype_bytes is the size of one value")]

    def diagnose(args, expected, got):
        b, s, h, t, d = args
        forward = "the forward only: the backward all-reduces as many activation gradients"
        if math.isclose(got, expected / d):
            return f"multiply by dtype_bytes: values are {d} bytes each" + (f" (or is it {forward}?)" if d == 2 else "")
        if math.isclose(got, expected / 2):
            return f"that is {forward}"
        if math.isclose(got, 4 * b * s * h * d) or math.isclose(got, 8 * b * s * h * d):
            return "a ring all-reduce sends 2 (t-1)/t n bytes per GPU, not n or 2n"
        return None

    check_cases("layer_bytes", layer_bytes, [(a, _ref_bytes(*a), h) for a, h in cases], diagnose=diagnose)


def check_tp_layer_time(layer_time) -> None:
    """``layer_time(b, s, h, t, alpha, beta, dtype_bytes)``: seconds of those all-reduces on one link type."""
    tcases = [((1, 4096, 8192, 8, 1e-6, 450e9, 2), "4 ring all-reduces, each 2(t-1) alpha + 2(t-1)/t n / beta"),
              ((1, 4096, 8192, 8, 5e-6, 50e9, 2), "the same formula on a network link"),
              ((2, 512, 1024, 2, 1e-5, 1e9, 4), "alpha is paid 2 (t-1) times per all-reduce")]

    def tdiagnose(args, expected, got):
        b, s, h, t, alpha, beta, d = args
        if math.isclose(got, _ref_bytes(b, s, h, t, d) / beta):
            return "you left out the latency: each all-reduce also pays 2 (t-1) alpha"
        return None

    check_cases("layer_time", layer_time, [(a, _ref_time(*a), h) for a, h in tcases], diagnose=tdiagnose)


def check_sequence_parallel_mlp(fn) -> None:
    """``fn(x_shard, w1, b1, w2, b2)``: rank r holds positions r s/p ... of x and returns the same positions of
    ``gelu(x w1 + b1) w2 + b2``, with one all-gather before and one reduce-scatter after (no all-reduce)."""
    for p in (2, 4):
        rng = np.random.default_rng(40 + p)
        s, d, f = 4 * p, 6, 16
        x, w1, b1 = rng.normal(size=(s, d)), rng.normal(size=(d, f)), rng.normal(size=f)
        w2, b2 = rng.normal(size=(f, d)), rng.normal(size=d)
        want = gelu(x @ w1 + b1) @ w2 + b2
        shards = np.split(x, p)
        outs, trace, macs = _run("sequence_parallel_mlp", fn, p,
                                 [(shards[r].copy(), _counted(w1), b1, _counted(w2), b2) for r in range(p)])
        for r, got in enumerate(outs):
            mine = want[r * s // p:(r + 1) * s // p]
            if got.shape != mine.shape:
                hint = ("each rank returns only its own positions, s/p rows: the reduce-scatter both sums the "
                        "partial products and hands each rank its rows")
                fail(f"sequence_parallel_mlp on {p} ranks: rank {r}'s result has the wrong shape", mine.shape,
                     got.shape, hint)
            if not np.allclose(got, mine, rtol=1e-10, atol=1e-12):
                if np.allclose(got, mine + (p - 1) * b2):
                    hint = "the second bias was added before the sum: every rank's copy of it was summed"
                elif np.allclose(got, want[:s // p]) and r:
                    hint = "rank r keeps positions r s/p to (r+1) s/p - 1 of the sum, not the first ones"
                else:
                    hint = ("gather every position first (the column-parallel layer needs the whole sequence), "
                            "then column -> GELU -> row, and let the reduce-scatter sum the partial products")
                fail(f"sequence_parallel_mlp on {p} ranks: rank {r}", mine[0, :3], got.reshape(-1)[:3], hint)
        names = _collectives(trace)
        if "all_reduce" in names or len(names) != 2:
            fail(f"sequence_parallel_mlp on {p} ranks: collectives on rank 0", "an all-gather, a reduce-scatter",
                 names, "an all-reduce is a reduce-scatter followed by an all-gather: split it, and let the "
                        "positions stay sharded between the two")
        if not ("gather" in names[0] and "reduce_scatter" in names[1]):
            fail(f"sequence_parallel_mlp on {p} ranks: collectives on rank 0, in order",
                 "an all-gather, then a reduce-scatter", names)
        _check_share("sequence_parallel_mlp", p, macs, s * (d * f + f * d),
                     "each rank multiplies the whole sequence by its columns of W1 and its rows of W2 only")
    passed("sequence_parallel_mlp: all-gather -> column -> GELU -> row -> reduce-scatter (2 and 4 ranks)")
