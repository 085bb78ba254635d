"""Mystery runs: a small training run with one fault drawn from a seed, to investigate (book ch33, lab 23).

Property: every fault leaves a signature in one place of the profile and nowhere else, in the order of the
book's protocol: a **memory** spike raises one rank's peak and no rank's time; a straggler stretches one rank's
**compute** and nothing else, unequal pipeline stages stretch a whole stage's; a slow link slows the
**communication** of the messages crossing it, buckets too small for the links' latency multiply the number of
collectives; one bucket for the whole model leaves the all-reduce exposed, which the **scaling** terms (overlap,
exposed share of the step) show. Hardware faults make the step slower than the estimate of the layout
(**validation** against ``predicted_step``); faults of the configuration are in the estimate already.

The seed draws the fault, the rank or link it hits, its size and the world size (2 to 8 ranks), so a diagnosis
can be graded on runs nobody has seen. The runs are shape-only (``md.parallel.train(backend=Backend(...,
shape_only=True))``): the same clocks, messages and memory as with values, in a fraction of a second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from minidist.estimate import predict_train
from minidist.hardware.cluster import Cluster
from minidist.nn import GPTConfig
from minidist.parallel import Backend, ParallelConfig, Resilience, train
from minidist.resilience import Faults

# the causes in the protocol's order: memory, compute (two), communication (two), scaling
CAUSES = ("memory spike", "straggler", "stage imbalance", "slow link", "latency-bound communication",
          "exposed collective")

REMEDIES = {
    "free the buffer": "find the allocation in that rank's memory snapshot and release it (or stop keeping it alive)",
    "replace the GPU": "drain the slow GPU's node and restart from the last checkpoint without it",
    "rebalance the stages": "cut the pipeline stages by measured cost, so that every stage takes as long",
    "replace the link": "reseat or replace the cable or port; until then, order the ring around it",
    "larger buckets": "fuse the gradients into fewer, larger all-reduces, each paying the latency once",
    "smaller buckets": "reduce each bucket as soon as its gradients are in, under the rest of the backward",
}

# the remedy that addresses each cause
REMEDY_OF = {"memory spike": "free the buffer", "straggler": "replace the GPU",
             "stage imbalance": "rebalance the stages", "slow link": "replace the link",
             "latency-bound communication": "larger buckets", "exposed collective": "smaller buckets"}

_DP_MODEL = GPTConfig(vocab_size=64, seq_len=32, d_model=192, n_layers=4, n_heads=4)
_HEALTHY_BUCKET = 4e6  # a few all-reduces per step, most of them under the backward
_PER_RANK_BATCH = 16


@dataclass
class Mystery:
    """A run to investigate: ``run`` (an ``md.parallel.train`` result: trace, step windows, memory),
    ``world_size``, ``cluster`` (the rated links the estimate assumes) and ``predicted_step`` (the estimate of
    the layout's step time, ``md.estimate.predict_train``). What went wrong is not an attribute."""

    seed: int
    run: object
    world_size: int
    cluster: Cluster
    predicted_step: float
    _answer: tuple = field(repr=False, default=())

    def __repr__(self) -> str:
        return (f"Mystery(seed={self.seed}, {self.world_size} ranks, step {self.run.time[-1] * 1e6:.1f} us, "
                f"predicted {self.predicted_step * 1e6:.1f} us)")

    def reveal(self) -> tuple:
        """(cause, subject, remedy): what was injected, for after the investigation."""
        return self._answer


def drawn_cause(seed: int) -> str:
    """The cause ``mystery_run(seed)`` injects, without running it (to pick seeds of a given cause)."""
    return CAUSES[int(np.random.default_rng([int(seed), 23]).integers(len(CAUSES)))]


@lru_cache(maxsize=64)
def mystery_run(seed: int, cause: str | None = None) -> Mystery:
    """A run with one fault drawn from ``seed`` (``cause``, one of ``CAUSES``, fixes which kind; the rank, the
    link, the size and the world size are still drawn from the seed). The same arguments give the same run, the
    same object even (the last runs are kept): read it, do not change it."""
    rng = np.random.default_rng([int(seed), 23])
    drawn = CAUSES[int(rng.integers(len(CAUSES)))]  # drawn even when given: the seed's other draws stay the same
    kind = drawn if cause is None else cause
    if kind not in CAUSES:
        raise ValueError(f"mystery_run: cause must be one of {CAUSES} or None, got {cause!r}")
    p = int(rng.choice([4, 4, 8]))
    model, cluster, faults = _DP_MODEL, Cluster(), None
    layout = dict(dp=p, bucket_bytes=_HEALTHY_BUCKET, algorithm="ring")
    subject = None
    if kind == "memory spike":
        subject = int(rng.integers(p))
        params = 12 * model.n_layers * model.d_model ** 2
        faults = Faults(spike={subject: float(rng.uniform(0.3, 1.0)) * 32 * params})  # 0.3-1x weights+grads+Adam
    elif kind == "straggler":
        subject = int(rng.integers(p))
        faults = Faults(slow={subject: float(rng.uniform(1.2, 2.0))})
    elif kind == "slow link":
        src = int(rng.integers(p))
        subject = (src, (src + 1) % p)  # a link of the ring, which every rank's traffic crosses
        cluster = Cluster(slow_links={subject: float(rng.uniform(3.0, 10.0))})
    elif kind == "latency-bound communication":
        layout["bucket_bytes"] = float(rng.uniform(1.0, 1e4))  # below any weight: one all-reduce per tensor
    elif kind == "exposed collective":
        layout["bucket_bytes"] = ParallelConfig.bucket_bytes  # PyTorch's 25 MB default: the whole model at once
    else:  # stage imbalance: two stages, the last one holding the vocabulary head
        p = 2
        model = GPTConfig(vocab_size=int(rng.choice([4096, 8192, 16384])), seq_len=32, d_model=192,
                          n_layers=int(rng.choice([4, 6])), n_heads=4)
        layout = dict(pp=2, microbatches=int(rng.choice([4, 8])))
    pc = ParallelConfig(**layout)
    batch = _PER_RANK_BATCH * pc.dp
    run = train(model, pc, steps=2, global_batch=batch, cluster=cluster, resilience=Resilience(faults=faults),
                backend=Backend("inprocess", shape_only=True))
    predicted = predict_train(model, pc, batch).step_time
    return Mystery(int(seed), run, p, Cluster(), predicted, (kind, subject, REMEDY_OF[kind]))
