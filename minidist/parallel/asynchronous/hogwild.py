"""Hogwild: workers that update shared parameters without locks (book ch29, lab 20).

Property: sparsity. When each example touches only a few coordinates, two workers' updates rarely touch the same
ones, so letting every worker read and write the shared vector whenever it likes, with no lock, loses almost
nothing: an update computed from a stale read of its coordinates is as good as a fresh one when nobody wrote them
in between (Niu et al. 2011, "Hogwild!: A Lock-Free Approach to Parallelizing Stochastic Gradient Descent"). With
dense examples every update touches every coordinate and nearly every read is stale by the time its write lands.

The shared vector lives on rank 0; each worker reads the coordinates of its next example (a message asking, one
answering), computes that example's sparse gradient on the simulated clock, and writes it back as an unsynchronised
add of only those coordinates. Rank 0 applies reads and writes in simulated-time order (each worker has one
message in flight, so the earliest is known, as in ``async_sgd``) and counts a *collision* when another worker wrote
one of an update's coordinates between its read and its write.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from minidist import dist
from minidist.hardware.cluster import Cluster
from minidist.parallel.asynchronous.async_sgd import earliest
from minidist.runtime import launch

READ, WRITE, STOP = 0.0, 1.0, -1.0


@dataclass(frozen=True)
class SparseLogistic:
    """A logistic regression on ``n`` examples in ``dim`` dimensions, each with ``nnz`` non-zero features
    (``nnz = dim``: dense); labels from a fixed random separator."""

    n: int = 2000
    dim: int = 1000
    nnz: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.nnz <= self.dim:
            raise ValueError(f"SparseLogistic: need 1 <= nnz <= dim, got nnz={self.nnz}, dim={self.dim}")

    def data(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(indices (n, nnz), values (n, nnz), labels (n,))."""
        rng = np.random.default_rng(self.seed)
        idx = np.argsort(rng.random((self.n, self.dim)), axis=1)[:, :self.nnz]
        val = rng.standard_normal((self.n, self.nnz))
        truth = rng.standard_normal(self.dim)
        y = ((val * truth[idx]).sum(axis=1) + 0.3 * rng.standard_normal(self.n) > 0).astype(float)
        return idx, val, y

    def loss(self, w: np.ndarray) -> float:
        idx, val, y = self.data()
        z = (val * w[idx]).sum(axis=1)
        return float(np.mean(np.logaddexp(0, z) - y * z))


@dataclass
class HogwildResult:
    """``params`` after ``updates`` writes; ``collisions``: the share of writes whose coordinates another worker
    wrote between their read and their write; ``losses`` after every ``every``-th write; ``time`` simulated."""

    params: np.ndarray
    collisions: float
    losses: list[float] = field(default_factory=list)
    time: float = 0.0


def _server(problem: SparseLogistic, workers: int, updates: int, every: int, timeout: float) -> dict:
    k = problem.nnz
    w = np.zeros(problem.dim)
    written = np.full(problem.dim, -1)  # the write number that last touched each coordinate, and who made it
    writer = np.full(problem.dim, -1)
    bufs = {r: np.empty(2 + 2 * k) for r in range(1, workers + 1)}
    pending = {r: dist.irecv(bufs[r], r) for r in bufs}
    read_at: dict[int, int] = {}
    writes, collided, losses, deadline = 0, 0, [], time.monotonic() + timeout
    while writes < updates:
        r = earliest(pending, deadline, f"hogwild: rank 0 waited {timeout} s for workers")
        kind, idx = bufs[r][0], bufs[r][2:2 + k].astype(np.int64)
        if kind == READ:
            read_at[r] = writes
            dist.send(np.r_[w[idx], 0.0], r)  # only the coordinates asked for
        else:
            touched = (written[idx] >= read_at[r]) & (writer[idx] != r)
            collided += bool(touched.any())
            np.add.at(w, idx, bufs[r][2 + k:])  # an unsynchronised add: no lock, nothing waits
            written[idx], writer[idx] = writes, r
            writes += 1
            if writes % every == 0:
                losses.append(problem.loss(w))
        pending[r] = dist.irecv(bufs[r], r)
    for r, h in pending.items():  # answer each worker's next read with a stop
        h.wait()
        while bufs[r][0] == WRITE:  # a write past the last update: dropped, its worker reads next
            h = dist.irecv(bufs[r], r)
            h.wait()
        dist.send(np.r_[np.zeros(k), STOP], r)
    return {"params": w, "collisions": collided / writes, "losses": losses, "time": dist.now()}


def _worker(problem: SparseLogistic, lr: float, mean_step: float, seed: int) -> None:
    rank, k = dist.get_rank(), problem.nnz
    rng = np.random.default_rng([seed, rank])
    idx_all, val_all, y_all = problem.data()
    got = np.empty(k + 1)
    while True:
        e = int(rng.integers(problem.n))
        idx, val = idx_all[e], val_all[e]
        dist.send(np.r_[READ, 0.0, idx, np.zeros(k)], 0)
        dist.recv(got, 0)
        if got[k] == STOP:
            return
        z = float(val @ got[:k])
        grad = (1 / (1 + np.exp(-z)) - y_all[e]) * val  # the example's gradient: its own coordinates only
        dist.compute(seconds=rng.exponential(mean_step), name="gradient")
        dist.send(np.r_[WRITE, 0.0, idx, -lr * grad], 0)


def _rank(problem, workers, updates, lr, mean_step, every, seed, timeout):
    if dist.get_rank() == 0:
        return _server(problem, workers, updates, every, timeout)
    _worker(problem, lr, mean_step, seed)
    return None


def train_hogwild(problem: SparseLogistic, workers: int, updates: int, lr: float = 0.5, *, mean_step: float = 1e-4,
                  every: int = 100, seed: int = 0, cluster: Cluster | None = None,
                  timeout: float = 60.0) -> HogwildResult:
    """``updates`` lock-free single-example SGD writes by ``workers`` workers (one worker: sequential SGD) on the
    vector held by rank 0; the loss over the whole dataset is recorded every ``every`` writes."""
    if not isinstance(workers, int) or workers < 1 or not isinstance(updates, int) or updates < 1:
        raise ValueError(f"train_hogwild: workers and updates must be ints >= 1, got {workers!r} and {updates!r}")
    res = launch(_rank, workers + 1, args=(problem, workers, updates, lr, mean_step, every, seed, timeout),
                 cluster=cluster or Cluster(), timeout=timeout)
    out = res[0]
    return HogwildResult(out["params"], out["collisions"], out["losses"], out["time"])
