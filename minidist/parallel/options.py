"""The options of ``md.parallel.train``, one small object per concern, each checking itself once when made.

``train(model, layout, steps, global_batch, optimizer=AdamW(lr=3e-3), precision=Precision("bf16"),
resilience=Resilience("ckpt", every=2, restart=True), backend=Backend("inprocess", shape_only=True))``:

- ``AdamW`` / ``SGD``: the optimizer and its hyper-parameters (``"adamw"`` and ``"sgd"`` stand for the defaults);
- ``Precision``: the format of the matrix products and the loss scale (``"bf16"`` stands for ``Precision("bf16")``);
- ``Resilience``: checkpoints, resuming, injected faults and restarts;
- ``Backend``: where the ranks run (``"sim"`` stands for ``Backend("sim")``), shape-only runs, the launch timeout.

What needs more than one object (the layout, the world size, shape-only against checkpoints) is checked by
``train``. The keywords these replace (``lr=``, ``checkpoint_dir=``, ``shape_only=``, ...) still work for one release:
``options`` turns them into the objects and warns once per keyword per process (``DeprecationWarning``).
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass, fields, replace
from typing import ClassVar

from minidist.parallel.checkpointing import CheckpointPlan
from minidist.parallel.mixed_precision import MixedPrecision
from minidist.resilience.failures import Faults


def _non_negative(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"parallel.train: {name} must be a finite number >= 0, got {value!r}")


def _betas(betas) -> tuple:
    if len(betas) != 2 or not all(isinstance(b, numbers.Real) and 0 <= b < 1 for b in betas):
        raise ValueError(f"parallel.train: betas must be two numbers in [0, 1), got {betas!r}")
    return tuple(betas)


@dataclass(frozen=True)
class AdamW:
    """PyTorch's AdamW: ``lr``, ``betas`` (two numbers in [0, 1)), ``eps`` and decoupled ``weight_decay``."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    name: ClassVar[str] = "adamw"

    def __post_init__(self) -> None:
        for name in ("lr", "weight_decay", "eps"):
            _non_negative(name, getattr(self, name))
        object.__setattr__(self, "betas", _betas(self.betas))

    def hyper(self) -> dict:
        """The keywords of ``FlatOptimizer``."""
        return {"lr": self.lr, "weight_decay": self.weight_decay, "betas": self.betas, "eps": self.eps}


@dataclass(frozen=True)
class SGD:
    """SGD with (heavy-ball) ``momentum`` and decoupled ``weight_decay``."""

    lr: float = 1e-3
    momentum: float = 0.9
    weight_decay: float = 0.0
    name: ClassVar[str] = "sgd"

    def __post_init__(self) -> None:
        for name in ("lr", "weight_decay", "momentum"):
            _non_negative(name, getattr(self, name))

    def hyper(self) -> dict:
        return {"lr": self.lr, "weight_decay": self.weight_decay, "momentum": self.momentum}


OPTIMIZERS = {"adamw": AdamW, "sgd": SGD}


def optimizer_of(optimizer) -> AdamW | SGD:
    """``optimizer=``: an ``AdamW``/``SGD`` or the name of one with its defaults."""
    if isinstance(optimizer, (AdamW, SGD)):
        return optimizer
    if isinstance(optimizer, str) and optimizer in OPTIMIZERS:
        return OPTIMIZERS[optimizer]()
    raise ValueError(f"parallel.train: optimizer must be 'adamw' or 'sgd' (or md.parallel.AdamW(...) / SGD(...)), "
                     f"got {optimizer!r}")


@dataclass(frozen=True)
class Precision:
    """Mixed precision: ``format`` None (the working dtype throughout), "bf16", "fp16" or "fp8" for the matrix
    products over an fp32 master copy; ``loss_scale`` None (dynamic for fp16, none otherwise), "dynamic" or a
    positive number (static)."""

    format: str | None = None
    loss_scale: str | float | None = None

    def __post_init__(self) -> None:
        self.mixed()  # checks both

    def mixed(self) -> MixedPrecision:
        return MixedPrecision(self.format, self.loss_scale)


@dataclass(frozen=True)
class Resilience:
    """Checkpoints every ``every`` steps into ``checkpoint_dir`` (``async_``: in the background; ``every=None``: only
    read, to resume); ``resume`` True, False or "or-start-over"; ``faults`` (``md.resilience.Faults``) to inject;
    ``restart``: a failed attempt restarts from the newest intact checkpoint, at most ``max_restarts`` times."""

    checkpoint_dir: str | None = None
    every: int | None = None
    async_: bool = False
    resume: bool | str = False
    restart: bool = False
    faults: Faults | None = None
    max_restarts: int = 20

    def __post_init__(self) -> None:
        resume = self.resume
        if resume is not True and resume is not False and resume != "or-start-over":
            raise ValueError(f"parallel.train: resume must be True, False or 'or-start-over', got {resume!r}")
        if resume and self.checkpoint_dir is None:
            raise ValueError(f"parallel.train: resume={resume!r} needs checkpoint_dir")
        every = self.every
        if self.checkpoint_dir is not None or every is not None:
            every_ok = every is None or (isinstance(every, int) and not isinstance(every, bool) and every >= 1)
            if self.checkpoint_dir is None or not every_ok:
                raise ValueError(f"parallel.train: checkpoints need checkpoint_dir (and checkpoint_every None or an "
                                 f"int >= 1), got {self.checkpoint_dir!r} and {every!r}")
        if self.faults is not None and not isinstance(self.faults, Faults):
            raise ValueError(f"parallel.train: faults must be an md.resilience.Faults, got {self.faults!r}")
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(f"parallel.train: max_restarts must be an int >= 0, got {self.max_restarts!r}")

    def plan(self) -> CheckpointPlan | None:
        """Where and how often to checkpoint; None without a checkpoint directory."""
        if self.checkpoint_dir is None:
            return None
        return CheckpointPlan(str(self.checkpoint_dir), self.every, bool(self.async_))


@dataclass(frozen=True)
class Backend:
    """Where the ranks run: ``name`` "sim" (processes over shared memory), "mpi" (``mpiexec``) or "inprocess"
    (threads of this process); ``shape_only``: arrays with shapes and no values; ``representatives`` (shape-only,
    in process): one rank stands for those that differ from it only in dp, ep or tp; ``timeout``: seconds."""

    name: str = "sim"
    shape_only: bool = False
    representatives: bool = False
    timeout: float = 120

    def __post_init__(self) -> None:
        if self.name not in ("sim", "mpi", "inprocess"):
            raise ValueError(f"parallel.train: backend must be 'sim' (shared memory), 'mpi' or 'inprocess', got "
                             f"{self.name!r}")
        if self.representatives and (not self.shape_only or self.name != "inprocess"):
            raise ValueError("parallel.train: representatives=True needs shape_only=True and backend='inprocess' "
                             "(ranks that are not simulated have no values to send)")


# the keywords train took before the objects: which object's field each one fills
LEGACY = {"lr": "optimizer", "betas": "optimizer", "eps": "optimizer", "weight_decay": "optimizer",
          "momentum": "optimizer", "precision": "precision", "loss_scale": "precision",
          "checkpoint_dir": "resilience", "checkpoint_every": "resilience", "async_checkpoint": "resilience",
          "resume": "resilience", "restart": "resilience", "faults": "resilience", "max_restarts": "resilience",
          "shape_only": "backend", "representatives": "backend", "timeout": "backend"}
RENAMED = {"precision": "format", "checkpoint_every": "every", "async_checkpoint": "async_"}
_warned: set[str] = set()


def _warn(keyword: str) -> None:
    if keyword in _warned:
        return
    _warned.add(keyword)
    group = LEGACY[keyword]
    new = {"optimizer": "optimizer=md.parallel.AdamW(...) or SGD(...)",
           "precision": "precision=md.parallel.Precision(...)", "resilience": "resilience=md.parallel.Resilience(...)",
           "backend": "backend=md.parallel.Backend(...)"}
    field = RENAMED.get(keyword, keyword)
    warnings.warn(f"md.parallel.train({keyword}=...) is deprecated and will be removed in the next release: give "
                  f"{new[group]} (its field {field!r}) instead", DeprecationWarning, stacklevel=4)


def options(optimizer, precision, resilience, backend, legacy: dict) -> tuple:
    """``train``'s options as the four objects, from the new form or from the old keywords (each warned once)."""
    unknown = sorted(set(legacy) - set(LEGACY))
    if unknown:
        raise TypeError(f"train() got an unexpected keyword argument {unknown[0]!r}")
    old = {group: {} for group in ("optimizer", "precision", "resilience", "backend")}
    if isinstance(precision, str):  # the old string form of precision=
        legacy = {"precision": precision, **legacy}
        precision = None
    for keyword, value in legacy.items():
        _warn(keyword)
        old[LEGACY[keyword]][RENAMED.get(keyword, keyword)] = value
    new = {"optimizer": not isinstance(optimizer, str), "precision": precision is not None,
           "resilience": resilience is not None, "backend": not isinstance(backend, str)}
    for group, given in old.items():
        if given and new[group]:
            raise ValueError(f"parallel.train: give {group}= or the old keywords {sorted(given)}, not both")
    if old["optimizer"]:
        optimizer = optimizer_of(optimizer)
        unused = {k: v for k, v in old["optimizer"].items() if k not in {f.name for f in fields(optimizer)}}
        for name, value in unused.items():  # accepted and ignored, as before, but checked
            _betas(value) if name == "betas" else _non_negative(name, value)
        optimizer = replace(optimizer, **{k: v for k, v in old["optimizer"].items() if k not in unused})
    optimizer = optimizer_of(optimizer)
    precision = Precision(**old["precision"]) if precision is None else precision
    resilience = Resilience(**old["resilience"]) if resilience is None else resilience
    backend = Backend(backend, **old["backend"]) if isinstance(backend, str) else backend
    for value, kind in ((precision, Precision), (resilience, Resilience), (backend, Backend)):
        if not isinstance(value, kind):
            raise ValueError(f"parallel.train: {kind.__name__.lower()} must be an md.parallel.{kind.__name__}, "
                             f"got {value!r}")
    return optimizer, precision, resilience, backend
