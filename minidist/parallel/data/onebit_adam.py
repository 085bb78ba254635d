"""1-bit Adam: data-parallel Adam that sends one bit per parameter once its variance has settled (book ch28, lab 19).

Property: Adam's momentum is linear in the gradients, ``m = b1 m + (1 - b1) g``, so averaging each replica's momentum
is the same as the momentum of the averaged gradient; its variance ``v`` is not (it squares the gradient), but it
changes slowly once training has settled (Tang et al. 2021, "1-bit Adam: Communication Efficient Large-Scale
Training with Adam's Convergence Speed"). So after ``warmup`` steps of ordinary data-parallel Adam, ``v`` is frozen
and the replicas stop exchanging gradients: each updates its own momentum from its own gradient and the momenta are
averaged through a compressed all-reduce, one sign bit per entry and one scale (mean absolute value) per chunk.

The compressed all-reduce is the paper's: each rank adds its residual to its momentum, cuts it into ``p`` chunks,
compresses each and sends chunk ``j`` to rank ``j`` (an all-to-all); rank ``j`` averages the ``p`` chunks it got,
adds its own server-side residual, compresses again and all-gathers. Both compressions keep what they dropped
(error feedback), so the signal is only delayed, never lost. Per step and rank that is ``2 (p - 1) / p`` of the
packed bits plus ``2 (p - 1)`` scales: 1/32 of an fp32 ring all-reduce, 1/64 of a float64 one.

It is its own rank loop (``train_onebit_adam``), like local SGD: it is a different optimiser, not a layout of one.
With ``compress=False`` the momenta are averaged exactly, and the run equals one device running Adam with its
variance frozen after the warm-up (tested).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from minidist import dist
from minidist.data import get_batch, load_tokens
from minidist.hardware.cluster import Cluster
from minidist.nn import GPT
from minidist.parallel.asynchronous.local_sgd import LocalResult, _assign, _flat
from minidist.runtime import launch


@dataclass(frozen=True)
class OneBitAdam:
    """``warmup`` steps of exact data-parallel Adam, then frozen variance and 1-bit momentum averaging;
    ``error_feedback=False`` drops the residuals (to see what they are for), ``compress=False`` averages exactly."""

    warmup: int = 20
    error_feedback: bool = True
    compress: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.warmup, int) or self.warmup < 1:
            raise ValueError(f"OneBitAdam: warmup must be an int >= 1 (steps of uncompressed Adam), got "
                             f"{self.warmup!r}")

    @staticmethod
    def padded(n: int, p: int) -> int:
        """Entries after padding to whole bytes of bits in each of the ``p`` chunks."""
        return -(-n // (8 * p)) * 8 * p

    def payload_bytes(self, n: int, p: int, itemsize: int) -> float:
        """Bytes one rank sends per compressed step: the all-to-all and the all-gather of packed chunks."""
        chunk = self.padded(n, p) // p // 8 + itemsize
        return 2 * (p - 1) * chunk


def compress(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One bit per entry (the sign, zero counted positive) and the mean absolute value: ``(packed, scale)``."""
    return np.packbits(x >= 0), np.array([np.abs(x).mean()], x.dtype)


def decompress(packed: np.ndarray, scale: float, n: int, dtype) -> np.ndarray:
    return np.where(np.unpackbits(packed, count=n).astype(bool), scale, -scale).astype(dtype)


def onebit_all_reduce(x: np.ndarray, worker_err: np.ndarray, server_err: np.ndarray, feedback: bool) -> np.ndarray:
    """The mean over ranks of ``x`` (padded to ``OneBitAdam.padded``) through two 1-bit compressions with error
    feedback; ``worker_err`` (like ``x``) and ``server_err`` (this rank's chunk) are updated in place."""
    p = dist.get_world_size()
    n = x.size // p
    e = x.itemsize
    c = x + worker_err if feedback else x.copy()
    chunk_bytes = n // 8 + e
    send = np.empty((p, chunk_bytes), np.uint8)
    sent = np.empty_like(c)
    for j in range(p):
        bits, scale = compress(c[j * n:(j + 1) * n])
        send[j] = np.concatenate([bits, scale.view(np.uint8)])
        sent[j * n:(j + 1) * n] = decompress(bits, scale[0], n, x.dtype)
    if feedback:
        worker_err[...] = c - sent
    got = np.empty_like(send)
    dist.all_to_all_single(got.reshape(-1), send.reshape(-1))
    mine = sum(decompress(got[i, :n // 8], got[i, n // 8:].view(x.dtype)[0], n, x.dtype) for i in range(p)) / p
    s = mine + server_err if feedback else mine
    bits, scale = compress(s)
    if feedback:
        server_err[...] = s - decompress(bits, scale[0], n, x.dtype)
    everyone = np.empty((p, chunk_bytes), np.uint8)
    dist.all_gather_into_tensor(everyone.reshape(-1), np.concatenate([bits, scale.view(np.uint8)]), algorithm="ring")
    return np.concatenate([decompress(everyone[i, :n // 8], everyone[i, n // 8:].view(x.dtype)[0], n, x.dtype)
                           for i in range(p)])


def _grad(model) -> np.ndarray:
    return np.concatenate([(np.zeros(q.data.size) if q.grad is None else q.grad.reshape(-1)) for q in
                           model.parameters()]).astype(model.parameters()[0].data.dtype)


def _rank(cfg, method: OneBitAdam, steps: int, global_batch: int, lr: float, betas, eps: float, seed: int,
          tokens) -> dict:
    rank, p = dist.get_rank(), dist.get_world_size()
    model = GPT(cfg, seed=seed)
    rng = np.random.default_rng([seed, 2])  # the same global batch on every rank; each takes its share
    theta = _flat(model)
    n, pad = theta.size, OneBitAdam.padded(theta.size, p) - theta.size
    m, v = np.zeros_like(theta), np.zeros_like(theta)
    worker_err, server_err = np.zeros(n + pad, theta.dtype), np.zeros((n + pad) // p, theta.dtype)
    b1, b2 = betas
    losses, v_frozen = [], None
    share = global_batch // p
    for step in range(steps):
        x, y = get_batch(tokens, global_batch, cfg.seq_len, rng)
        _, loss = model(x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share])
        model.zero_grad()
        loss.backward()
        g = _grad(model)
        t = step + 1
        if step < method.warmup:  # ordinary data-parallel Adam: the gradients are averaged exactly
            g = np.pad(g, (0, pad))
            dist.all_reduce(g, algorithm="ring")
            g = g[:n] / p
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            update = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        else:
            if v_frozen is None:  # the variance stops here, bias-corrected once
                v_frozen = np.sqrt(v / (1 - b2 ** method.warmup)) + eps
                m = m / (1 - b1 ** method.warmup)
            local = np.pad(b1 * m + (1 - b1) * g, (0, pad))
            if method.compress:
                m = onebit_all_reduce(local, worker_err, server_err, method.error_feedback)[:n]
            else:
                dist.all_reduce(local, algorithm="ring")
                m = local[:n] / p
            update = m / v_frozen
        theta = theta - lr * update
        _assign(model, theta)
        losses.append(float(loss.data))  # this rank's share; averaged by the caller (no extra traffic)
        dist.progress(step + 1, steps, "step")
    return {"losses": losses, "params": {k: q.data.copy() for k, q in model.named_parameters()}}


def train_onebit_adam(model_config, dp: int, method: OneBitAdam, steps: int, global_batch: int = 8,
                      lr: float = 3e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, seed: int = 0,
                      cluster: Cluster | None = None, data=None, dtype: str = "float64",
                      timeout: float = 120) -> LocalResult:
    """Train ``GPT(model_config, seed)`` with 1-bit Adam on ``dp`` replicas, each taking its share of the same
    global batch; ``bytes_sent`` counts what each rank put on its links (losses are the global batch's)."""
    if not isinstance(dp, int) or dp < 1 or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"train_onebit_adam: dp and steps must be ints >= 1, got {dp!r} and {steps!r}")
    if not isinstance(method, OneBitAdam):
        raise ValueError(f"train_onebit_adam: method must be a OneBitAdam, got {method!r}")
    if global_batch % dp:
        raise ValueError(f"train_onebit_adam: global_batch={global_batch} must split evenly over dp={dp}")
    tokens = load_tokens(20_000, seed=0)[0] if data is None else np.asarray(data, dtype=np.int64).reshape(-1)
    cfg = replace(model_config, dtype=dtype)
    res = launch(_rank, dp, args=(cfg, method, steps, global_batch, lr, betas, eps, seed, tokens),
                 cluster=cluster or Cluster(), timeout=timeout)
    out = list(res)
    links = [e for e in res.trace if e.stream == "link"]
    sent = [float(sum(e.nbytes for e in links if e.rank == r)) for r in range(dp)]
    losses = [float(np.mean([o["losses"][s] for o in out])) for s in range(steps)]
    return LocalResult(losses, out[0]["params"], sent, res.time, max(0, steps - method.warmup))
