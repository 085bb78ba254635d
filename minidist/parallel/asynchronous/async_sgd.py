"""Asynchronous SGD through a parameter server, with stragglers and staleness (book ch29, lab 20).

Property: a synchronous step waits for the slowest of p workers, E[max T_i] = H_p E[T] for exponential step
times; an asynchronous server applies each gradient the moment it arrives, so no one waits and p workers deliver
p gradients per E[T]. The price is staleness: a gradient computed from the parameters of version v is applied to
version v + tau, and with p equally fast workers tau is about p - 1 on average. Dividing the learning rate by the
staleness (Zhang et al. 2016) keeps stale gradients from overshooting.

The server (rank 0) and the workers are ``md.launch`` ranks exchanging real messages. Each worker has exactly one
gradient in flight, so the server can process arrivals in *simulated* time order: it waits until every worker's
next message has arrived, applies the earliest, and answers that worker only; no later arrival can precede it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from minidist import dist
from minidist.hardware.cluster import Cluster
from minidist.runtime import launch


@dataclass
class AsyncResult:
    """``params`` after ``updates`` applied gradients; ``time`` the simulated seconds it took; ``staleness`` of each
    applied gradient; ``losses`` the objective after each update (if the problem gives one)."""

    params: np.ndarray
    time: float
    staleness: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


def earliest(pending: dict, deadline: float, what: str) -> int:
    """Wait until every worker's next message has arrived (each has one in flight), then take the earliest in
    simulated time: no later arrival can precede it. Returns its worker; ``what`` starts the timeout's message."""
    while not all(h.is_completed() for h in pending.values()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} {[r for r, h in pending.items() if not h.is_completed()]}")
        time.sleep(2e-4)
    r = min(pending, key=lambda q: (pending[q].end_time, q))
    pending[r].wait()
    return r


def _server(problem, workers: int, updates: int, lr: float, staleness_aware: bool, timeout: float) -> dict:
    d = problem.dim
    w, version = problem.init(), 0
    for r in range(1, workers + 1):
        dist.send(np.r_[w, version], r)
    bufs = {r: np.empty(d + 1) for r in range(1, workers + 1)}
    pending = {r: dist.irecv(bufs[r], r) for r in bufs}
    taus, losses, deadline = [], [], time.monotonic() + timeout
    while len(taus) < updates:
        r = earliest(pending, deadline, f"async_sgd: the server waited {timeout} s for workers")
        g, read = bufs[r][:d], int(bufs[r][d])
        tau = version - read
        w = w - (lr / max(1, tau) if staleness_aware else lr) * g
        version += 1
        taus.append(tau)
        losses.append(problem.loss(w))
        last = dist.now()
        dist.send(np.r_[w, version], r)
        pending[r] = dist.irecv(bufs[r], r)
    for r, h in pending.items():  # collect the last gradients in flight, then stop every worker
        h.wait()
        dist.send(np.r_[np.full(d, np.nan), -1.0], r)
    return {"params": w, "staleness": taus, "losses": losses, "time": last}


def _worker(problem, mean_step: float, seed: int, slow: dict) -> None:
    rank, d = dist.get_rank(), problem.dim
    rng = np.random.default_rng([seed, rank])
    buf = np.empty(d + 1)
    while True:
        dist.recv(buf, 0)
        if buf[d] < 0:
            return
        g = problem.grad(buf[:d], rng)
        dist.compute(seconds=rng.exponential(mean_step) * slow.get(rank, 1.0), name="gradient")
        dist.send(np.r_[g, buf[d]], 0)


def _rank(problem, workers, updates, lr, staleness_aware, mean_step, seed, slow, timeout):
    if dist.get_rank() == 0:
        return _server(problem, workers, updates, lr, staleness_aware, timeout)
    _worker(problem, mean_step, seed, slow)
    return None


def train_async(problem, workers: int, updates: int, lr: float, *, staleness_aware: bool = True,
                mean_step: float = 1e-3, seed: int = 0, slow: dict | None = None, cluster: Cluster | None = None,
                timeout: float = 60.0) -> AsyncResult:
    """Apply ``updates`` gradients of ``problem`` (an object with ``dim``, ``init()``, ``grad(w, rng)`` and
    ``loss(w)``) computed by ``workers`` workers whose step times are exponential with mean ``mean_step``
    simulated seconds (``slow``: {worker rank: factor}); rank 0 is the parameter server."""
    if not isinstance(workers, int) or workers < 1 or not isinstance(updates, int) or updates < 1:
        raise ValueError(f"train_async: workers and updates must be ints >= 1, got {workers!r} and {updates!r}")
    res = launch(_rank, workers + 1, args=(problem, workers, updates, lr, staleness_aware, mean_step, seed,
                                           slow or {}, timeout), cluster=cluster or Cluster(), timeout=timeout)
    out = res[0]
    return AsyncResult(out["params"], out["time"], out["staleness"], out["losses"])


def _sync_rank(problem, steps, lr, mean_step, seed, slow):
    rank, p = dist.get_rank(), dist.get_world_size()
    rng, w = np.random.default_rng([seed, rank + 1]), problem.init()
    losses = []
    for _ in range(steps):
        g = problem.grad(w, rng)
        dist.compute(seconds=rng.exponential(mean_step) * slow.get(rank + 1, 1.0), name="gradient")
        dist.all_reduce(g)
        w = w - lr * g / p
        losses.append(problem.loss(w))
    return {"params": w, "time": dist.now(), "losses": losses}


def train_sync(problem, workers: int, steps: int, lr: float, *, mean_step: float = 1e-3, seed: int = 0,
               slow: dict | None = None, cluster: Cluster | None = None) -> AsyncResult:
    """The synchronous counterpart: every step, each worker computes a gradient (same step-time law, worker r is
    rank r - 1 here), one all-reduce averages them and all apply it; everyone waits for the slowest."""
    res = launch(_sync_rank, workers, args=(problem, steps, lr, mean_step, seed, slow or {}),
                 cluster=cluster or Cluster())
    return AsyncResult(res[0]["params"], max(o["time"] for o in res), [0] * steps, res[0]["losses"])


@dataclass(frozen=True)
class Logistic:
    """A logistic regression on ``n`` synthetic points in ``dim`` dimensions: minibatch gradients of ``batch``."""

    n: int = 2000
    dim: int = 20
    batch: int = 32
    seed: int = 0

    def data(self) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        x = rng.standard_normal((self.n, self.dim))
        y = (x @ rng.standard_normal(self.dim) + 0.5 * rng.standard_normal(self.n) > 0).astype(float)
        return x, y

    def init(self) -> np.ndarray:
        return np.zeros(self.dim)

    def grad(self, w: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        x, y = self.data()
        rows = rng.integers(0, self.n, self.batch)
        return x[rows].T @ (1 / (1 + np.exp(-(x[rows] @ w))) - y[rows]) / self.batch

    def loss(self, w: np.ndarray) -> float:
        x, y = self.data()
        z = x @ w
        return float(np.mean(np.logaddexp(0, z) - y * z))
