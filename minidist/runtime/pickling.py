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
"""

from __future__ import annotations

import importlib
import io
import pickle
import sys
import types

import dill
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


def loads(data: bytes) -> object:
    return dill.loads(data)


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
