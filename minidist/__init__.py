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
from minidist import dist  # noqa: E402,F401
from minidist.hardware.cluster import Cluster  # noqa: E402,F401
from minidist.hardware.memory import OutOfMemoryError  # noqa: E402,F401
from minidist.runtime import RankError, ReduceOp, launch  # noqa: E402,F401
from minidist.runtime.mesh import DeviceMesh, init_device_mesh  # noqa: E402,F401

# isort: split

# --- resilience (checkpoint files, failures) ---
from minidist import resilience  # noqa: E402,F401

# isort: split

# --- parallel ---
from minidist import parallel  # noqa: E402,F401

# isort: split

# --- estimate ---
from minidist import estimate, profiling  # noqa: E402,F401

# isort: split

# --- viz, labs ---
from minidist import hardware, labs, viz  # noqa: E402,F401
