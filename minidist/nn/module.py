"""Module and Parameter: a model is a tree of modules whose leaves are named parameter tensors.

Assigning a ``Parameter`` or a ``Module`` to an attribute registers it, in assignment order, so
``named_parameters()`` gives stable dotted names (``blocks.0.attn.wq.weight``) and a fixed order.
Every parallel strategy relies on that order and those names: ranks agree on which tensor is
which without talking, and a sharded checkpoint maps back to the full model by name.

Initialisation takes an explicit ``np.random.Generator`` (or a seed), never numpy's global state,
so building the same model with the same seed gives bitwise-identical weights in every process.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from minidist.autograd import Tensor
from minidist.autograd.shape_only import shape_rng
from minidist.autograd.tensor import RemovableHandle


def as_rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    """A Generator from a Generator, a seed, or None (seed 0: never the global state); while models are built
    shape-only (``md.autograd.shape_only.building``) a stand-in whose draws hold no values."""
    stand_in = shape_rng()
    if stand_in is not None:
        return stand_in
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(0 if rng is None else rng)


class Parameter(Tensor):
    """A tensor that a module owns and an optimizer updates (``requires_grad=True``)."""

    def __init__(self, data, requires_grad: bool = True) -> None:
        super().__init__(np.asanyarray(data), requires_grad=requires_grad)

    def __repr__(self) -> str:
        return f"Parameter(shape={self.data.shape}, dtype={self.data.dtype})"


class Module:
    """Base class: subclasses call ``super().__init__()`` then assign parameters and submodules."""

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}: call super().__init__() before assigning {name!r}")
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        object.__delattr__(self, name)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args, **kwargs):
        hooks = self.__dict__.get("_forward_hooks")
        if not hooks:
            return self.forward(*args, **kwargs)
        for fn in list(hooks["pre"]):
            changed = fn(self, args)
            if changed is not None:
                args = changed if isinstance(changed, tuple) else (changed,)
        out = self.forward(*args, **kwargs)
        for fn in list(hooks["post"]):
            changed = fn(self, args, out)
            out = out if changed is None else changed
        return out

    def register_forward_pre_hook(self, fn) -> RemovableHandle:
        """Call ``fn(module, args)`` before each forward; a non-None result replaces the positional args
        (torch's rule). Strategies use it to change what a module sees without touching its code."""
        return self._add_hook("pre", fn)

    def register_forward_hook(self, fn) -> RemovableHandle:
        """Call ``fn(module, args, output)`` after each forward; a non-None result replaces the output."""
        return self._add_hook("post", fn)

    def _add_hook(self, kind: str, fn) -> RemovableHandle:
        if not callable(fn):
            raise TypeError(f"{type(self).__name__}: a forward hook must be callable, got {type(fn).__name__}")
        if "_forward_hooks" not in self.__dict__:
            object.__setattr__(self, "_forward_hooks", {"pre": [], "post": []})
        self._forward_hooks[kind].append(fn)
        return RemovableHandle(self._forward_hooks[kind], fn)

    # ---- traversal -------------------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module and every descendant, depth first in registration order."""
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def children(self) -> Iterator[Module]:
        yield from self._modules.values()

    def named_parameters(self) -> Iterator[tuple[str, Parameter]]:
        """(dotted name, parameter) pairs; a parameter shared by two modules appears once, under its first name."""
        seen: set[int] = set()
        for prefix, m in self.named_modules():
            for name, p in m._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{prefix}.{name}" if prefix else name), p

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def num_parameters(self) -> int:
        """Number of scalar parameters (shared ones counted once)."""
        return int(sum(p.data.size for p in self.parameters()))

    # ---- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of every parameter array, keyed by dotted name."""
        return {name: p.data.copy() for name, p in self.named_parameters()}

    def load_state_dict(self, state: dict[str, np.ndarray], strict: bool = True) -> None:
        """Copy arrays into the parameters, in place (cast to each parameter's dtype).

        With ``strict`` every name must match both ways; without it unknown and missing names are
        ignored. Shapes must always match.
        """
        params = dict(self.named_parameters())
        if strict:
            missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
            if missing or unexpected:
                raise KeyError(f"{type(self).__name__}.load_state_dict: missing keys {missing}, "
                               f"unexpected keys {unexpected}")
        for name, value in state.items():
            p = params.get(name)
            if p is None:
                continue
            value = np.asarray(value)
            if value.shape != p.data.shape:
                raise ValueError(f"{type(self).__name__}.load_state_dict: {name!r} has shape {value.shape}, "
                                 f"the parameter has {p.data.shape}")
            p.data[...] = value  # in place: other views of the weights (shared buffers) stay valid

    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    def to(self, dtype) -> Module:
        """Cast every parameter to ``dtype`` (gradients are dropped); returns self."""
        dtype = np.dtype(dtype)
        for p in self.parameters():
            p.data = p.data.astype(dtype)
            p.grad = None
        return self

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, child in self._modules.items():
            body = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        return lines[0] + ")" if len(lines) == 1 else "\n".join(lines) + "\n)"


class ModuleList(Module):
    """A list of modules registered under the names "0", "1", ..."""

    def __init__(self, modules=()) -> None:
        super().__init__()
        self._list: list[Module] = []
        for m in modules:
            self.append(m)

    def append(self, module: Module) -> ModuleList:
        if not isinstance(module, Module):
            raise TypeError(f"ModuleList.append: expected a Module, got {type(module).__name__}")
        setattr(self, str(len(self._list)), module)
        self._list.append(module)
        return self

    def __getitem__(self, i):
        return ModuleList(self._list[i]) if isinstance(i, slice) else self._list[i]

    def __len__(self) -> int:
        return len(self._list)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._list)
