"""minidist: distributed training derived from its algebra, run on simulated devices.

Layers import downward only: autograd, nn/optim/data, precision <- hardware <- runtime/collectives <- resilience
<- parallel <- estimate <- viz, labs (see README.md).
Each section below is filled by the layer that owns it.
"""

__version__ = "0.1.0"

# --- autograd, nn, optim, data (foundation) ---
from minidist import autograd  # noqa: E402,F401
from minidist.autograd import Tensor, enable_grad, is_grad_enabled, no_grad, tensor  # noqa: E402,F401

# isort: split
from minidist import data, nn, optim, precision  # noqa: E402,F401
from minidist.nn import GPT, GPTConfig  # noqa: E402,F401

# isort: split

# --- runtime, collectives, hardware ---
from minidist import dist, hardware  # noqa: E402,F401
from minidist.hardware.cluster import Cluster  # noqa: E402,F401
from minidist.hardware.memory import OutOfMemoryError  # noqa: E402,F401
from minidist.runtime import RankError, ReduceOp, launch  # noqa: E402,F401
from minidist.runtime.mesh import DeviceMesh, init_device_mesh  # noqa: E402,F401

# isort: split

# --- resilience, parallel, estimate, profiling, viz, labs: imported on first use (md.parallel, ...) ---
# A rank started by spawn (macOS's and Windows' default) imports this package before it runs anything; these
# layers are a third of that import, and most rank functions never touch them.
_LAZY = ("resilience", "parallel", "estimate", "profiling", "viz", "labs")


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return importlib.import_module(f"minidist.{name}")  # binds it here too: later lookups skip this
    raise AttributeError(f"module 'minidist' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


# isort: split
import sys as _sys  # noqa: E402

if "IPython" in _sys.modules:  # a notebook or an IPython shell: the labs' error messages hold from the first cell
    from minidist import labs  # noqa: E402,F401
