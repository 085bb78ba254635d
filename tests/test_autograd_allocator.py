"""allocator.py: freed activation buffers stay in the process instead of being page-faulted in again."""

import resource
import sys

import numpy as np
import pytest

from minidist.autograd import allocator

linux_glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or not allocator.keep_freed_memory(),
                                 reason="malloc tuning applies to Linux with glibc only")


def test_opt_out_by_environment(monkeypatch):
    monkeypatch.setenv("MINIDIST_KEEP_FREED_MEMORY", "0")
    assert allocator.keep_freed_memory() is False


@linux_glibc
def test_freed_activations_are_reused_without_page_faults():
    x = np.ones((1024, 1024), dtype=np.float32)

    def forward_and_free():  # several 4 MiB activations alive at once, then all freed
        acts = [x * 2 for _ in range(8)]
        del acts

    for _ in range(3):
        forward_and_free()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        forward_and_free()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    # with malloc's defaults the freed heap top is trimmed and every page faults in again: ~20,000
    assert faults < 1024, faults
