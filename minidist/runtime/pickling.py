"""Sending a notebook's function to a spawned rank: by value, with only the globals it uses.

Under the fork start method a rank inherits the parent's memory, so ``fn`` needs no pickling. A
spawned rank starts from a fresh interpreter whose ``__main__`` is not the notebook's, so ``fn`` has
to travel by value. Two choices make that work where dill's defaults do not:

* ``recurse=True``: the function carries the globals it refers to (``np``, a constant, another
  function of the notebook) instead of a reference to ``__main__``'s namespace, which the rank
  would not have (``NameError: name 'np' is not defined``).
* Every module already imported under its own name travels by reference (the rank imports it).
  dill copies a module's whole namespace by value when it is not installed under the interpreter's
  prefix, which is the case for minidist itself under an editable install; such a copy drags
  unpicklable objects along (numpy ufuncs made by ``np.vectorize``, locks).

A class of ``__main__`` travels by value too, and the rank puts it into its own ``__main__`` under its name
(``loads``). An object of that class the rank returns is then pickled by name, as under fork, and the launcher
gets it back as an instance of its own class, not of a copy (``isinstance`` holds).
"""

from __future__ import annotations

import importlib
import io
import pickle
import sys
import types

import dill
from dill._dill import _create_type
from dill._dill import save_module as _dill_save_module


class _Pickler(dill.Pickler):
    dispatch = dill.Pickler.dispatch.copy()


def _save_module(pickler: _Pickler, module: types.ModuleType) -> None:
    name = module.__name__
    if name != "__main__" and sys.modules.get(name) is module:
        pickler.save_reduce(importlib.import_module, (name,), obj=module)
    else:
        _dill_save_module(pickler, module)


_Pickler.dispatch[types.ModuleType] = _save_module


def dumps(obj: object) -> bytes:
    """Pickle ``obj`` (functions with the globals they use; imported modules by name)."""
    buf = io.BytesIO()
    _Pickler(buf, recurse=True).dump(obj)
    return buf.getvalue()


def _create_main_type(typeobj, *args):
    cls = _create_type(typeobj, *args)
    main = sys.modules["__main__"]
    if cls.__module__ == "__main__" and cls.__qualname__ == cls.__name__ and not hasattr(main, cls.__name__):
        setattr(main, cls.__name__, cls)
    return cls


class _Unpickler(dill.Unpickler):
    def find_class(self, module: str, name: str):
        if module == "dill._dill" and name == "_create_type":
            return _create_main_type
        return super().find_class(module, name)


def loads(data: bytes) -> object:
    """Unpickle what ``dumps`` made; classes of the launcher's ``__main__`` join this process's ``__main__``."""
    return _Unpickler(io.BytesIO(data)).load()


def dumps_report(obj: object) -> bytes:
    """Pickle what a rank reports to its launcher: with the C pickler when it can (dill's is pure Python,
    and a training run's events and memory ledger took a sixth of a short run to pickle and unpickle),
    with dill when the value holds what only dill can carry (a lambda, a class defined in a function)."""
    try:
        return b"p" + pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    except Exception:
        return b"d" + dill.dumps(obj)


def loads_report(data: bytes) -> object:
    return pickle.loads(memoryview(data)[1:]) if data[:1] == b"p" else dill.loads(memoryview(data)[1:])
