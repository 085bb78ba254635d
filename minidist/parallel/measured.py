"""What a rank process really holds, measured by tracemalloc beside its memory ledger (chapter 19, lab 13).

The ledger books the arrays the strategies allocate; this asks the process. ``tracemalloc`` counts every
buffer allocated after it starts, and numpy reports its arrays in a domain of their own, so between steps
the numpy domain is the model state a rank keeps, and the peak during a step is what it really needed.
The ledger's peak falls short of the real one by what ``memory.NOT_BOOKED`` lists.
"""

from __future__ import annotations

import gc
import tracemalloc
from dataclasses import replace

import numpy as np

from minidist import dist
from minidist.data import get_batch, load_tokens
from minidist.nn import GPT
from minidist.parallel.data.flat_optim import FlatOptimizer
from minidist.parallel.memory import NOT_BOOKED, state_bytes_per_param
from minidist.parallel.mesh import build_mesh
from minidist.parallel.parallelize import parallelize
from minidist.runtime import launch

__all__ = ["NOT_BOOKED", "measure_held"]


def _held(model_config, layout, global_batch: int, seed: int) -> dict:
    tokens = load_tokens(5_000, seed=seed)[0]
    model, ledger = GPT(model_config, seed=seed), dist.memory()
    tracemalloc.start()  # the model built before does not count: from here on, what the strategy allocates
    opt = FlatOptimizer("adamw", lr=1e-3)
    par = parallelize(model, build_mesh(layout), layout, opt, state_bytes_per_param(model_config.dtype, "adamw"))
    del model
    rng = np.random.default_rng(seed)

    def step() -> None:
        xs, ys, weights = par.batch.split(*get_batch(tokens, global_batch, model_config.seq_len, rng))
        par.engine.run(xs, ys, weights)
        opt.step(par.reducer.pieces())
        par.reducer.after_step(par.model)
        gc.collect()

    step()
    only = tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)  # numpy's buffers, not the Python objects
    arrays = sum(t.size for t in tracemalloc.take_snapshot().filter_traces([only]).traces)
    everything = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    ledger.reset_peak()
    step()
    peak = tracemalloc.get_traced_memory()[1]  # of everything: tracemalloc keeps no peak per domain
    tracemalloc.stop()
    return {"arrays": arrays, "objects": everything - arrays, "peak": peak, "ledger_peak": ledger.peak_total,
            "ledger_state": sum(ledger.current[c] for c in ("params", "grads", "optimizer"))}


def measure_held(model_config, layout, global_batch: int = 8, seed: int = 0, dtype: str = "float64") -> list[dict]:
    """What each rank process really holds, by tracemalloc, beside what its ledger booked (AdamW).

    Trains two steps of ``GPT(model_config)`` in ``dtype`` laid out by ``layout`` (a ``ParallelConfig``). Per rank:
    ``arrays``, the bytes of numpy buffers alive between steps (the model state); ``objects``, the Python
    objects then alive; ``peak``, the most the process held during the second step; ``ledger_state`` and
    ``ledger_peak``, the ledger's model state between steps and its peak in that step. The ledger's peak
    falls short of the real one by what :data:`NOT_BOOKED` lists."""
    return launch(_held, world_size=layout.world_size, args=(replace(model_config, dtype=dtype), layout,
                                                             global_batch, seed))
