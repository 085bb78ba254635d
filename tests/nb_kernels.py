"""A pytest plugin for the nbval run (``make test`` loads it with ``-p tests.nb_kernels``).

nbval starts one kernel per notebook. jupyter_client picks free TCP ports for it and the kernel binds
them a moment later; a process that takes one in between (likely while two test workers start kernels
side by side) makes the kernel die before it answers, and the whole notebook fails without running a
cell. nbval has no option for that, so its kernel start is wrapped here: that one failure is retried
with a new manager (so fresh ports), up to ``KERNEL_STARTS`` times, as ``make check`` does
(``minidist.labs.execute.start_kernel``). Every other failure is raised at once.
"""

from __future__ import annotations

import nbval.kernel

from minidist.labs.execute import KERNEL_STARTS

_nbval_start = nbval.kernel.start_new_kernel


def start_new_kernel(*args, **kwargs):
    """nbval's ``start_new_kernel``, tried again when the kernel died before replying."""
    for _ in range(KERNEL_STARTS - 1):
        try:
            return _nbval_start(*args, **kwargs)
        except RuntimeError as e:
            if "died before replying" not in str(e):
                raise
    return _nbval_start(*args, **kwargs)


# RunningKernel looks the function up in its module at every start, so replacing it there is enough
nbval.kernel.start_new_kernel = start_new_kernel
