"""What ``md.parallel.train`` measured: ``TrainResult``, its fields flat and the same fields grouped by concern."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Training:
    """What was learned: the loss of every step, the weights and gradients after the last (empty shape-only), each
    rank's weights (replicated layouts), the number of parameters; mixed precision's loss scale of every step and
    the steps skipped because a gradient overflowed."""

    losses: list[float]
    params: dict[str, np.ndarray]
    grads: dict[str, np.ndarray]
    rank_params: list[dict[str, np.ndarray]] | None
    num_params: int
    loss_scales: list[float]
    skipped_steps: int
    shape_only: bool


@dataclass(frozen=True)
class Timing:
    """Simulated time: seconds per step (slowest rank), each rank's step windows, the whole run (failures and
    restarts included) and the trace of every charge."""

    step: list[float]
    windows: list[list[tuple[float, float]]]
    total: float
    trace: object


@dataclass(frozen=True)
class MemoryUse:
    """Memory: each rank's peak bytes per ledger category, its peak of all categories together and the categories
    at that peak, its bytes held over time; host memory (offload), the activations log and the state bytes per
    parameter."""

    peak_by_category: list[dict[str, float]]
    peak: list[float]
    peak_breakdown: list[dict[str, float]]
    timeline: list[list[tuple[float, float]]]
    host: list[dict[str, float]]
    activations: dict
    state_bytes: dict


@dataclass(frozen=True)
class Communication:
    """Bytes rank r sent on links during step s (``bytes[s][r]``, from its own start), and the trace."""

    bytes: list[list[float]]
    trace: object


@dataclass(frozen=True)
class ResilienceReport:
    """A resilient run: simulated seconds from start to end (failures, lost work, restarts and checkpoints
    included), what failed, the seconds lost, the seconds each rank's steps waited for checkpoints."""

    total_time: float
    failures: list[dict]
    lost_time: float
    checkpoint_blocked: list[float]


@dataclass
class TrainResult:
    """What a run measured. ``time``: simulated seconds per step (slowest rank; the first step from the moment the
    last rank finished its setup, as ``windows[r][0]`` starts, and a step right after a checkpoint from the moment
    the last rank left it, ``restart.step_times``: an early rank's wait for that is in its ``checkpoint_blocked``);
    ``memory[r]``: rank r's peak bytes per ledger category; ``comm_bytes[s][r]``: bytes rank r sent on links during
    step s (from its own start).

    The same fields grouped by concern, read-only views made on each access: ``training`` (losses and weights),
    ``timing``, ``memory_use``, ``communication`` and ``resilience``. The flat fields stay, without warnings: the
    labs read them."""

    losses: list[float]
    params: dict[str, np.ndarray]
    grads: dict[str, np.ndarray]
    time: list[float]
    memory: list[dict[str, float]]
    trace: object
    comm_bytes: list[list[float]]
    host_memory: list[dict[str, float]] = field(default_factory=list)
    rank_params: list[dict[str, np.ndarray]] | None = None  # replicated layouts: every rank's weights
    activations: dict = field(default_factory=dict)
    state_bytes: dict = field(default_factory=dict)
    num_params: int = 0
    windows: list[list[tuple[float, float]]] = field(default_factory=list)
    # a resilient run (checkpoint_dir / faults): simulated seconds from start to end including failures, lost
    # work, restarts and checkpoints; what failed; the simulated seconds each rank's steps waited for checkpoints
    total_time: float = 0.0
    failures: list[dict] = field(default_factory=list)
    lost_time: float = 0.0
    checkpoint_blocked: list[float] = field(default_factory=list)
    peak_memory: list[float] = field(default_factory=list)  # rank r's peak of all categories together (bytes)
    peak_breakdown: list[dict[str, float]] = field(default_factory=list)  # rank r's categories at that peak
    memory_timeline: list[list[tuple[float, float]]] = field(default_factory=list)  # rank r: (seconds, bytes held)
    loss_scales: list[float] = field(default_factory=list)  # mixed precision: the loss scale of every step
    skipped_steps: int = 0  # steps skipped because a gradient overflowed
    shape_only: bool = False  # trained on arrays with shapes and no values: no losses, weights or gradients

    @property
    def training(self) -> Training:
        return Training(self.losses, self.params, self.grads, self.rank_params, self.num_params, self.loss_scales,
                        self.skipped_steps, self.shape_only)

    @property
    def timing(self) -> Timing:
        return Timing(self.time, self.windows, self.total_time, self.trace)

    @property
    def memory_use(self) -> MemoryUse:
        return MemoryUse(self.memory, self.peak_memory, self.peak_breakdown, self.memory_timeline, self.host_memory,
                         self.activations, self.state_bytes)

    @property
    def communication(self) -> Communication:
        return Communication(self.comm_bytes, self.trace)

    @property
    def resilience(self) -> ResilienceReport:
        return ResilienceReport(self.total_time, self.failures, self.lost_time, self.checkpoint_blocked)

    def __repr__(self) -> str:
        if self.shape_only:
            loss = "no loss values (shape only)"
        elif self.losses:
            loss = f"loss {self.losses[0]:.4f} -> {self.losses[-1]:.4f}"
        else:
            loss = "no steps"
        sim = f", {np.mean(self.time) * 1e3:.4g} ms/step simulated" if self.time else ""
        return f"TrainResult({len(self.losses)} steps, {loss}{sim})"
