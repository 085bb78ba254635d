"""The optimizer base: parameter groups, per-parameter state, and a state_dict.

An optimizer only needs objects with ``.data`` (a numpy array it updates in place) and ``.grad``
(an array of the same shape, or None to skip the parameter). That is true of ``nn.Parameter``
and equally of a flat shard of parameters, which is how ZeRO (lab 13) reuses these classes on the
slice of the model a rank owns.

State layout (documented because ZeRO shards it): ``opt.state[i]`` is a dict for the i-th
parameter, counting through the groups in order; arrays in it have the parameter's shape and
dtype. ``opt.param_groups`` is a list of dicts, each with ``"params"`` (a list) and the
hyper-parameters (``"lr"`` and the rest), which a scheduler may change between steps.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import numpy as np


def grad_array(p) -> np.ndarray | None:
    """The gradient of ``p`` as a numpy array (None when it has none)."""
    g = p.grad
    if g is None or isinstance(g, np.ndarray):
        return g
    return np.asarray(getattr(g, "data", g))


class Optimizer:
    """Holds parameter groups and state; subclasses implement ``_update(group, index, p, g)``."""

    def __init__(self, params: Iterable, defaults: dict[str, Any]) -> None:
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.defaults = dict(defaults)
        self.param_groups: list[dict[str, Any]] = []
        for g in groups:
            unknown = set(g) - set(defaults) - {"params"}
            if unknown:
                raise ValueError(f"{type(self).__name__}: unknown group options {sorted(unknown)}")
            self.param_groups.append({**defaults, **g, "params": list(g["params"])})
        self.state: dict[int, dict[str, Any]] = {}

    def params(self) -> list:
        """Every parameter, in the order that defines the state indices."""
        return [p for g in self.param_groups for p in g["params"]]

    def zero_grad(self) -> None:
        """Drop every gradient (set to None), so the next backward writes fresh ones."""
        for p in self.params():
            p.grad = None

    def step(self) -> None:
        """Apply one update to every parameter that has a gradient."""
        i = 0
        for group in self.param_groups:
            for p in group["params"]:
                g = grad_array(p)
                if g is not None:
                    if g.shape != p.data.shape:
                        raise ValueError(f"{type(self).__name__}.step: parameter {i} has shape {p.data.shape} "
                                         f"but its gradient has shape {g.shape}")
                    self._update(group, i, p, g)
                i += 1

    def _update(self, group: dict[str, Any], index: int, p, g: np.ndarray) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Copies of the state and of the hyper-parameters; parameters are referred to by index."""
        groups, i = [], 0
        for g in self.param_groups:
            n = len(g["params"])
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": list(range(i, i + n))})
            i += n
        return {"state": copy.deepcopy(self.state), "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; arrays are copied and cast to each parameter's dtype."""
        groups = state_dict["param_groups"]
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError(f"{type(self).__name__}.load_state_dict: group sizes do not match this optimizer")
        params = self.params()
        state = {}
        for key, s in state_dict["state"].items():
            i = int(key)
            p = params[i]
            entry = {}
            for k, v in s.items():
                if isinstance(v, np.ndarray):
                    if v.shape != p.data.shape:
                        raise ValueError(f"{type(self).__name__}.load_state_dict: state[{i}][{k!r}] has shape "
                                         f"{v.shape}, parameter has {p.data.shape}")
                    v = v.astype(p.data.dtype, copy=True)
                entry[k] = v
            state[i] = entry
        self.state = state
        for mine, saved in zip(self.param_groups, groups):
            mine.update({k: v for k, v in saved.items() if k != "params"})
