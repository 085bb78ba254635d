"""Gradient compression: the data-parallel reduction of fewer bytes (book ch28, lab 19).

Property: the all-reduce only needs a *sum*. A compressor that is linear (PowerSGD's projection onto a shared
low-rank basis) commutes with the sum, so the compressed pieces can still be all-reduced; a nonlinear one
(quantisation, top-k) cannot be summed in its compressed form, so each rank's payload is all-gathered and
every rank decompresses and adds them all. Stochastic rounding (QSGD, TernGrad) keeps each compressed
gradient unbiased, E[C(g)] = g; a biased compressor (top-k, low rank) keeps what it dropped in a residual
and adds it to the next gradient (error feedback), so nothing is lost, only delayed.

Each compressor is a frozen description (it lives in ``ParallelConfig(compression=...)``); its state (the
residuals, PowerSGD's warm-started basis, a random generator) lives with the reducer of each rank. Every
payload travels as one buffer by a ring, so its bytes have a closed form (``payload_bytes``) that the
trace can be checked against. The reduction is synchronous: compressing needs the whole bucket.

Every payload's size depends on the bucket's size alone, never on its values (top-k and DGC send k = ceil(ratio n)
entries whichever they are), so a shape-only bucket (``autograd/shape_only.py``) sends payloads of the same sizes
by the same collectives and charges what the run with values does (``_reduce_shapes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from minidist import dist
from minidist.autograd.shape_only import ShapeArray
from minidist.autograd.shape_only import empty as shape_empty
from minidist.parallel.data.data_parallel import DataParallel


def _gather_sum(payload: np.ndarray, group, decode) -> np.ndarray:
    """All-gather every rank's byte payload (ring) and add up their decodings."""
    p = group.size()
    everyone = np.empty((p, payload.size), np.uint8)
    dist.all_gather_into_tensor(everyone.reshape(-1), payload, group=group, algorithm="ring")
    return sum(decode(everyone[r]) for r in range(p))


def _pack(*arrays: np.ndarray) -> np.ndarray:
    return np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays])


def _top_k_sum(source: np.ndarray, k: int, flat: np.ndarray, group) -> np.ndarray:
    """Send the ``k`` largest-magnitude entries of ``source`` (int32 index + value), write the sum of every rank's
    sparse vector into ``flat``; returns the indices this rank sent."""
    n = source.size
    idx = np.sort(np.argpartition(np.abs(source), n - k)[n - k:]).astype(np.int32)
    vals = source[idx].copy()

    def decode(b: np.ndarray) -> np.ndarray:
        out = np.zeros(n, flat.dtype)
        out[b[:4 * k].view(np.int32)] = b[4 * k:].view(flat.dtype)
        return out

    flat[...] = _gather_sum(_pack(idx, vals), group, decode)
    return idx


@dataclass(frozen=True)
class Quantize:
    """Round to ``2^(bits-1) - 1`` levels of one scale per bucket (max |g|): deterministic, biased."""

    bits: int = 8

    def __post_init__(self) -> None:
        if self.bits != 8:
            raise ValueError(f"Quantize: bits must be 8 (one int8 per element), got {self.bits!r}")

    def payload_bytes(self, n: int, itemsize: int) -> int:
        return n + itemsize

    def reduce(self, flat: np.ndarray, group, state: dict) -> None:
        scale = np.array([np.max(np.abs(flat)) / 127 or 1.0], flat.dtype)
        codes = np.round(flat / scale[0]).astype(np.int8)
        n, e = flat.size, flat.itemsize
        flat[...] = _gather_sum(_pack(codes, scale), group,
                                lambda b: b[:n].view(np.int8).astype(flat.dtype) * b[n:n + e].view(flat.dtype)[0])


@dataclass(frozen=True)
class QSGD:
    """Alistarh et al. 2017: |g_i| / ||g|| rounded stochastically to one of ``levels`` steps, with its sign, so
    E[C(g)] = g; one int8 per element and the norm."""

    levels: int = 127

    def __post_init__(self) -> None:
        if not isinstance(self.levels, int) or not 1 <= self.levels <= 127:
            raise ValueError(f"QSGD: levels must be an int in 1..127 (int8 codes), got {self.levels!r}")

    def payload_bytes(self, n: int, itemsize: int) -> int:
        return n + itemsize

    def reduce(self, flat: np.ndarray, group, state: dict) -> None:
        rng = state.setdefault("rng", np.random.default_rng([7, dist.get_rank()]))
        norm = np.array([np.linalg.norm(flat) or 1.0], flat.dtype)
        level = np.abs(flat) / norm[0] * self.levels
        low = np.floor(level)
        codes = (np.sign(flat) * (low + (rng.random(flat.size) < level - low))).astype(np.int8)
        n, e, s = flat.size, flat.itemsize, self.levels
        flat[...] = _gather_sum(_pack(codes, norm), group,
                                lambda b: b[:n].view(np.int8).astype(flat.dtype) * (b[n:n + e].view(flat.dtype)[0] / s))


@dataclass(frozen=True)
class TernGrad:
    """Wen et al. 2017: each element becomes -1, 0 or +1 times max |g|, stochastically so that E[C(g)] = g;
    two bits per element (four to a byte) and the scale."""

    def payload_bytes(self, n: int, itemsize: int) -> int:
        return -(-n // 4) + itemsize

    def reduce(self, flat: np.ndarray, group, state: dict) -> None:
        rng = state.setdefault("rng", np.random.default_rng([11, dist.get_rank()]))
        scale = np.array([np.max(np.abs(flat)) or 1.0], flat.dtype)
        t = (np.sign(flat) * (rng.random(flat.size) < np.abs(flat) / scale[0])).astype(np.int64) + 1  # 0, 1, 2
        n, e = flat.size, flat.itemsize
        quads = np.pad(t, (0, -n % 4)).reshape(-1, 4)
        packed = (quads[:, 0] | quads[:, 1] << 2 | quads[:, 2] << 4 | quads[:, 3] << 6).astype(np.uint8)
        m = packed.size

        def decode(b: np.ndarray) -> np.ndarray:
            q = b[:m].astype(np.int64)
            codes = np.stack([q & 3, q >> 2 & 3, q >> 4 & 3, q >> 6 & 3], axis=1).reshape(-1)[:n]
            return (codes - 1).astype(flat.dtype) * b[m:m + e].view(flat.dtype)[0]

        flat[...] = _gather_sum(_pack(packed, scale), group, decode)


@dataclass(frozen=True)
class TopK:
    """Send the ``ratio`` largest-magnitude elements (int32 index + value); with ``error_feedback`` the rest
    is kept and added to the next gradient (Stich et al. 2018; DGC, Lin et al. 2018)."""

    ratio: float = 0.01
    error_feedback: bool = True

    def __post_init__(self) -> None:
        if not (isinstance(self.ratio, (int, float)) and 0 < self.ratio <= 1):
            raise ValueError(f"TopK: ratio must be in (0, 1], got {self.ratio!r}")

    def k(self, n: int) -> int:
        return max(1, math.ceil(self.ratio * n))

    def payload_bytes(self, n: int, itemsize: int) -> int:
        return self.k(n) * (4 + itemsize)

    def reduce(self, flat: np.ndarray, group, state: dict) -> None:
        acc = flat + state["residual"] if self.error_feedback and "residual" in state else flat.copy()
        idx = _top_k_sum(acc, self.k(flat.size), flat, group)
        if self.error_feedback:
            acc[idx] = 0
            state["residual"] = acc


@dataclass(frozen=True)
class DGC:
    """Deep gradient compression (Lin et al. 2018): top-k with *momentum correction*. Each replica keeps its own
    velocity u <- m u + g and accumulates it, v <- v + u; it sends the top ``ratio`` of v and clears those entries
    in both u and v (momentum factor masking), so a delayed entry carries the momentum it would have had. The
    momentum lives here: train with plain SGD (``optimizer="sgd", momentum=0``)."""

    ratio: float = 0.01
    momentum: float = 0.9

    def __post_init__(self) -> None:
        if not (isinstance(self.ratio, (int, float)) and 0 < self.ratio <= 1) or not 0 <= self.momentum < 1:
            raise ValueError(f"DGC: ratio must be in (0, 1] and momentum in [0, 1), got {self.ratio!r}, "
                             f"{self.momentum!r}")

    def payload_bytes(self, n: int, itemsize: int) -> int:
        return TopK(self.ratio).payload_bytes(n, itemsize)

    def reduce(self, flat: np.ndarray, group, state: dict) -> None:
        u = state.setdefault("velocity", np.zeros_like(flat))
        v = state.setdefault("accumulated", np.zeros_like(flat))
        u *= self.momentum
        u += flat
        v += u
        idx = _top_k_sum(v, TopK(self.ratio).k(flat.size), flat, group)
        v[idx] = 0
        u[idx] = 0


@dataclass(frozen=True)
class PowerSGD:
    """Vogels et al. 2019: each weight matrix M (m x n) of the bucket is sent as M Q and M^T P for a shared
    rank-``rank`` basis, by two all-reduces (the projection is linear); Q is reused from the last step
    (``warm_start``) and the part outside the basis is fed back (``error_feedback``). Vectors (biases, norms)
    are all-reduced as they are."""

    rank: int = 2
    error_feedback: bool = True
    warm_start: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"PowerSGD: rank must be an int >= 1, got {self.rank!r}")

    def matrices(self, shapes: list[tuple[int, ...]]) -> list[bool]:
        """Which parameters (by shape) are compressed: matrices whose rank exceeds ``rank``."""
        return [len(s) >= 2 and min(s[0], math.prod(s[1:])) > self.rank for s in shapes]

    def reduced(self, shapes: list[tuple[int, ...]]) -> tuple[int, int]:
        """Elements of the two all-reduces: every P with the vectors, then every Q (0: that one is not sent)."""
        low = self.matrices(shapes)
        first = sum(s[0] * self.rank if c else math.prod(s) for s, c in zip(shapes, low))
        second = sum(math.prod(s[1:]) * self.rank for s, c in zip(shapes, low) if c)
        return first, second

    def payload_bytes(self, shapes: list[tuple[int, ...]], p: int, itemsize: int) -> float:
        """Bytes one rank sends: two ring all-reduces (P with the vectors, then Q), each padded to p chunks."""
        padded = sum(-(-x // p) * p for x in self.reduced(shapes) if x)
        return 2 * (p - 1) / p * padded * itemsize

    def reduce(self, flat: np.ndarray, group, state: dict, shapes: list[tuple[int, ...]]) -> None:
        p, r = group.size(), self.rank
        offsets = np.cumsum([0] + [math.prod(s) for s in shapes])
        views = [flat[a:b].reshape(s[0], -1) if len(s) >= 2 else flat[a:b] for a, b, s in
                 zip(offsets, offsets[1:], shapes)]
        low = self.matrices(shapes)
        res = state.setdefault("residual", [np.zeros_like(v) for v in views])
        ms = [v + e if self.error_feedback else v.copy() for v, e in zip(views, res)]
        qs = state.get("q") if self.warm_start and "q" in state else None
        if qs is None:
            rng = np.random.default_rng(13)  # the same basis on every rank
            qs = [rng.standard_normal((m.shape[1], r)).astype(flat.dtype) if c else None for m, c in zip(ms, low)]
        ps = [m @ q if c else m.reshape(-1) for m, q, c in zip(ms, qs, low)]
        summed = _all_reduce_list(ps, group, p)
        ps = [np.linalg.qr(s)[0] if c else s for s, c in zip(summed, low)]
        qs_local = [m.T @ pm for m, pm, c in zip(ms, ps, low) if c]
        q_sum = iter(_all_reduce_list(qs_local, group, p))
        state["q"] = qs = [next(q_sum) if c else None for c in low]
        for i, (v, m, pm, q, c) in enumerate(zip(views, ms, ps, qs, low)):
            if c:
                res[i] = m - pm @ (pm.T @ m) if self.error_feedback else res[i]
                v[...] = pm @ q.T
            else:
                v[...] = pm.reshape(v.shape)


def _all_reduce_list(arrays: list[np.ndarray], group, p: int) -> list[np.ndarray]:
    """Sum a list of arrays over ``group`` with one ring all-reduce of their concatenation, padded to p chunks."""
    if not arrays:
        return []
    sizes = [a.size for a in arrays]
    buf = np.concatenate([a.reshape(-1) for a in arrays])
    buf = np.pad(buf, (0, -buf.size % p))
    dist.all_reduce(buf, group=group, algorithm="ring")
    cut = np.cumsum([0] + sizes)
    return [buf[a:b].reshape(x.shape) for a, b, x in zip(cut, cut[1:], arrays)]


COMPRESSORS = (Quantize, QSGD, TernGrad, TopK, DGC, PowerSGD)


def _reduce_shapes(compressor, flat: ShapeArray, group, shapes: list[tuple[int, ...]]) -> None:
    """What ``compressor.reduce`` sends for a bucket without values: the same collectives on payloads of the same
    sizes (each depends on the bucket's size only), so the same clocks and traffic; nothing is decoded."""
    p = group.size()
    if isinstance(compressor, PowerSGD):
        for x in compressor.reduced(shapes):
            if x:  # as _all_reduce_list: one ring all-reduce, padded to p chunks
                dist.all_reduce(shape_empty((x + -x % p,), flat.dtype), group=group, algorithm="ring")
        return
    n = compressor.payload_bytes(flat.size, flat.itemsize)
    everyone = shape_empty((p * n,), np.uint8)
    dist.all_gather_into_tensor(everyone, shape_empty((n,), np.uint8), group=group, algorithm="ring")


class CompressedDataParallel(DataParallel):
    """DDP whose bucket reduction is ``compressor``'s (the averaging weights ride on the loss, so every
    compressor sums). A rank keeps one state per bucket."""

    def __init__(self, compressor, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.compressor = compressor
        self.states: dict[str, dict] = {u.name: {} for u in self.units}

    def collective(self, unit, flat: np.ndarray):
        if self.dp == 1:
            return None
        state = self.states[unit.name]
        shapes = [tuple(p.data.shape) for p in unit.params]
        if isinstance(flat, ShapeArray):
            _reduce_shapes(self.compressor, flat, self.group, shapes)
        elif isinstance(self.compressor, PowerSGD):
            body = flat[:sum(math.prod(s) for s in shapes)]
            self.compressor.reduce(body, self.group, state, shapes)
        else:
            self.compressor.reduce(flat, self.group, state)
        return None
