"""Local SGD and DiLoCo: replicas that synchronise every H steps (book ch29, lab 20).

Property: data parallelism averages gradients every step, so its replicas never differ. Averaging the
*parameters* every H steps instead lets each replica drift for H steps on its own data, but the average of the
replicas still moves downhill, and communication falls by a factor of H. The averaged displacement of an
outer round, Delta = theta - mean_i theta_i, is a pseudo-gradient: plain local SGD applies it as it is
(outer learning rate 1, no momentum); DiLoCo (Douillard et al. 2023) feeds it to an outer optimiser with
Nesterov momentum, which recovers most of what the drift costs. With H = 1 and plain SGD inside, the rule is
exactly synchronous data parallelism (the average of one SGD step from the same point is one step along the
average gradient).

The replicas are ``md.launch`` ranks; the only communication is one ring all-reduce of the parameter vector per
outer round, so the bytes on the wire are 1/H of data parallelism's (``tests/test_local_sgd.py`` measures them).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from minidist import dist
from minidist.autograd import no_grad
from minidist.data import batches, get_batch, load_tokens
from minidist.hardware.cluster import Cluster
from minidist.nn import GPT
from minidist.optim import SGD, AdamW
from minidist.runtime import launch


@dataclass(frozen=True)
class LocalSGD:
    """``period`` inner steps between synchronisations; the outer step ``theta -= outer_lr * update`` with
    ``update`` the averaged displacement, or its (Nesterov) momentum when ``outer_momentum`` > 0."""

    period: int = 50
    outer_lr: float = 1.0
    outer_momentum: float = 0.0
    nesterov: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.period, int) or self.period < 1:
            raise ValueError(f"LocalSGD: period must be an int >= 1, got {self.period!r}")
        if not self.outer_lr > 0 or not 0 <= self.outer_momentum < 1:
            raise ValueError(f"LocalSGD: outer_lr must be > 0 and outer_momentum in [0, 1), got {self.outer_lr!r}, "
                             f"{self.outer_momentum!r}")

    def outer_step(self, theta: np.ndarray, delta: np.ndarray, velocity: np.ndarray) -> np.ndarray:
        """The new global parameters from the averaged displacement ``delta`` (``velocity`` is updated in place)."""
        if self.outer_momentum == 0:
            return theta - self.outer_lr * delta
        velocity *= self.outer_momentum
        velocity += delta
        step = delta + self.outer_momentum * velocity if self.nesterov else velocity
        return theta - self.outer_lr * step


def DiLoCo(period: int = 50, outer_lr: float = 0.7, outer_momentum: float = 0.9) -> LocalSGD:  # noqa: N802
    """DiLoCo's outer optimiser: Nesterov momentum on the pseudo-gradient (the paper's 0.7 and 0.9)."""
    return LocalSGD(period, outer_lr, outer_momentum, nesterov=True)


@dataclass
class LocalResult:
    """``losses[s]``: the replicas' mean training loss at inner step s; ``params``: the final global parameters;
    ``bytes_sent``: bytes each rank put on links; ``time``: simulated seconds; ``rounds``: synchronisations;
    ``times[s]``: simulated seconds at the end of inner step s (its synchronisation included), slowest rank."""

    losses: list[float]
    params: dict[str, np.ndarray]
    bytes_sent: list[float]
    time: float
    rounds: int
    drift: list[float] = field(default_factory=list)  # per round: mean distance of a replica from the average
    times: list[float] = field(default_factory=list)


def _flat(model) -> np.ndarray:
    return np.concatenate([p.data.reshape(-1) for p in model.parameters()])


def _assign(model, flat: np.ndarray) -> None:
    o = 0
    for p in model.parameters():
        p.data[...] = flat[o:o + p.data.size].reshape(p.data.shape)
        o += p.data.size


def _rank(cfg, method: LocalSGD, steps: int, batch: int, lr: float, optimizer: str, seed: int, tokens) -> dict:
    rank, p = dist.get_rank(), dist.get_world_size()
    model = GPT(cfg, seed=seed)  # the same initial weights on every replica
    inner = AdamW(model.parameters(), lr=lr) if optimizer == "adamw" else SGD(model.parameters(), lr=lr)
    data = batches(tokens, batch, cfg.seq_len, seed=seed * 1000 + 17 + rank)  # each replica its own stream
    theta, velocity = _flat(model), None
    pad = -theta.size % p
    losses, drift, rounds, times = [], [], 0, []
    for step in range(steps):
        x, y = next(data)
        _, loss = model(x, y)
        loss.backward()
        inner.step()
        inner.zero_grad()
        losses.append(float(loss.data))
        if (step + 1) % method.period == 0 or step == steps - 1:
            local = _flat(model)
            delta = np.pad(theta - local, (0, pad))
            dist.all_reduce(delta, algorithm="ring")
            delta = delta[:theta.size] / p
            drift.append(float(np.linalg.norm(theta - local - delta)))
            velocity = np.zeros_like(theta) if velocity is None else velocity
            theta = method.outer_step(theta, delta, velocity)
            _assign(model, theta)
            rounds += 1
        times.append(dist.now())
        dist.progress(step + 1, steps, "step")
    return {"losses": losses, "params": {n: q.data.copy() for n, q in model.named_parameters()}, "drift": drift,
            "rounds": rounds, "times": times}


def train_local(model_config, dp: int, method: LocalSGD, steps: int, batch_per_replica: int = 8, lr: float = 3e-3,
                optimizer: str = "adamw", seed: int = 0, cluster: Cluster | None = None, data=None,
                dtype: str = "float64", timeout: float = 120, backend: str = "sim") -> LocalResult:
    """Train ``GPT(model_config, seed)`` on ``dp`` replicas that synchronise every ``method.period`` steps
    (in ``dtype``, float64 like ``md.parallel.train``, so the two runs' bytes compare). ``backend`` is
    ``md.launch``'s: ``"inprocess"`` runs the replicas as threads taking turns, with the same results."""
    if not isinstance(dp, int) or dp < 1 or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"train_local: dp and steps must be ints >= 1, got {dp!r} and {steps!r}")
    if optimizer not in ("adamw", "sgd"):
        raise ValueError(f"train_local: optimizer must be 'adamw' or 'sgd', got {optimizer!r}")
    tokens = load_tokens(20_000, seed=0)[0] if data is None else np.asarray(data, dtype=np.int64).reshape(-1)
    cfg = replace(model_config, dtype=dtype)
    res = launch(_rank, dp, args=(cfg, method, steps, batch_per_replica, lr, optimizer, seed, tokens),
                 cluster=cluster or Cluster(), timeout=timeout, backend=backend)
    out = list(res)
    links = [e for e in res.trace if e.stream == "link"]
    sent = [float(sum(e.nbytes for e in links if e.rank == r)) for r in range(dp)]
    losses = [float(np.mean([o["losses"][s] for o in out])) for s in range(steps)]
    return LocalResult(losses, out[0]["params"], sent, res.time, out[0]["rounds"],
                       [float(np.mean(d)) for d in zip(*[o["drift"] for o in out])],
                       [float(max(t)) for t in zip(*[o["times"] for o in out])])


def evaluate(model_config, params: dict[str, np.ndarray], data=None, batches_: int = 4, batch: int = 32,
             seed: int = 99) -> float:
    """Mean loss of ``params`` on ``batches_`` fixed random batches (the same for every run compared)."""
    tokens = load_tokens(20_000, seed=0)[0] if data is None else np.asarray(data, dtype=np.int64).reshape(-1)
    model = GPT(model_config, seed=0)
    for name, q in model.named_parameters():
        q.data[...] = params[name]
    rng, total = np.random.default_rng(seed), 0.0
    with no_grad():
        for _ in range(batches_):
            x, y = get_batch(tokens, batch, model_config.seq_len, rng)
            total += float(model(x, y)[1].data)
    return total / batches_
