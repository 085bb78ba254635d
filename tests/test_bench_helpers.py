"""The benchmarks' own helpers: what they measure against must be what they say."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("blas", ["1", "2"])
def test_the_autograd_bench_gives_pytorch_the_threads_numpy_really_has(blas):
    # numpy reads OPENBLAS_NUM_THREADS when it loads its BLAS; an answer from OMP_NUM_THREADS or the core count
    # gave PyTorch twice numpy's threads and read the ratio 1.66 instead of 1.1
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env.update(OPENBLAS_NUM_THREADS=blas, OMP_NUM_THREADS="3", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", "from tests.bench.bench_autograd import numpy_threads; "
                          "print(numpy_threads())"], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == min(int(blas), os.cpu_count() or 1)
