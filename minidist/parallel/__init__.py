"""Parallel training on simulated devices: the strategies, and ``parallelize``/``train`` that compose them.

How a run is put together (Part VI), the modules at this level: ``config`` (ParallelConfig, one description
of a layout), ``mesh`` (build_mesh: the only rank arithmetic), ``refusals`` (the layouts refused up front, and
why), ``parallelize`` (every strategy applied to one model in one documented order), ``engine`` (a step's
micro-batches, one after another or as a pipeline schedule) and ``train`` (the one rank loop,
``md.parallel.train``; ``options``: its options, one object per concern; ``result``: ``TrainResult``);
``runner`` (a micro-batch's forward and backward with the strategies' hooks),
``recompute`` (activation checkpointing), ``offload`` (host tier), ``memory`` (ledger accounting),
``mixed_precision``, and checkpoints, restarts and resharding (``checkpointing``, ``restart``, ``rank_state``,
``checkpoint_sweep``).

The strategies, one subpackage per part of the book, each named after the property it exploits (its
``__init__`` says which, and which labs read it):

* ``data`` (chapters 14, 20, 28; labs 08, 13, 19): DDP, ZeRO, FSDP, flat parameters, gradient compression,
  1-bit Adam;
* ``tensor`` (chapters 15, 17, 30; labs 09, 22): Megatron's column/row-parallel linears, sequence and
  vocabulary parallelism, tensor-parallel overlap;
* ``pipeline`` (chapter 16; labs 10, 22): schedules as data, their checker and simulator, DualPipeV, split
  backward, stages and the executor;
* ``context`` (chapter 17; lab 11): the online softmax, ring attention, Ulysses;
* ``expert`` (chapter 18; labs 12, 16): all-to-all dispatch and combine, expert data parallelism;
* ``asynchronous`` (chapter 29; lab 20): Local SGD and DiLoCo, Hogwild, asynchronous SGD.

Imports go one way only (tests/test_layering.py holds the order): the base modules above, then
``asynchronous`` < ``data`` < ``pipeline`` < ``tensor`` < ``context`` < ``expert``, then the modules that
compose them (``parallelize``, ``train``, ...).

At scale (chapter 34): ``at_scale`` (one step of a published run on thousands of simulated GPUs, shape-only, one
rank per pipeline stage).
"""

from minidist.parallel.config import ParallelConfig
from minidist.parallel.data.flat import FlatUnit
from minidist.parallel.memory import graph_bytes, state_bytes_per_param
from minidist.parallel.mesh import build_mesh
from minidist.parallel.options import SGD, AdamW, Backend, Precision, Resilience
from minidist.parallel.parallelize import Parallelized, parallelize, split_sizes
from minidist.parallel.train import TrainResult, train

# isort: split
from minidist.parallel.tensor import (
    ColumnParallelLinear,
    RowParallelLinear,
    TPGroup,
    VocabParallelEmbedding,
    all_gather_matmul,
    matmul_reduce_scatter,
    tensor_parallelize,
    vocab_parallel_cross_entropy,
)

# isort: split
from minidist.parallel import pipeline
from minidist.parallel.pipeline import (
    PipelineExecutor,
    Schedule,
    ScheduleError,
    check_schedule,
    dualpipe,
    make_schedule,
    measure_schedule,
    partition,
    schedules,
    simulate,
)

# isort: split
from minidist.parallel.context import (
    CPGroup,
    blockwise_attention,
    context_parallelize,
    ring_attention,
    ulysses_attention,
)
from minidist.parallel.expert import EPGroup, expert_parallelize

# isort: split
from minidist.parallel.checkpoint_sweep import checkpoint_cost, fitted_optimum, sweep_checkpoint_interval

# isort: split
from minidist.parallel import at_scale
from minidist.parallel.at_scale import ScaleStep, simulate_step

# isort: split
from minidist.parallel.asynchronous import (
    DiLoCo,
    LocalSGD,
    Logistic,
    SparseLogistic,
    evaluate,
    train_async,
    train_hogwild,
    train_local,
    train_sync,
)
from minidist.parallel.data import (
    DGC,
    QSGD,
    OneBitAdam,
    PowerSGD,
    Quantize,
    TernGrad,
    TopK,
    compression,
    train_onebit_adam,
)

__all__ = ["FlatUnit", "ParallelConfig", "Parallelized", "TrainResult", "build_mesh", "graph_bytes", "parallelize",
           "split_sizes", "state_bytes_per_param", "train"]
__all__ += ["AdamW", "SGD", "Backend", "Precision", "Resilience"]
__all__ += ["ColumnParallelLinear", "RowParallelLinear", "TPGroup", "VocabParallelEmbedding", "tensor_parallelize",
            "vocab_parallel_cross_entropy", "all_gather_matmul", "matmul_reduce_scatter"]
__all__ += ["CPGroup", "EPGroup", "blockwise_attention", "context_parallelize", "expert_parallelize",
            "ring_attention", "ulysses_attention"]
__all__ += ["PipelineExecutor", "Schedule", "ScheduleError", "check_schedule", "dualpipe", "make_schedule",
            "measure_schedule", "partition", "pipeline", "schedules", "simulate"]
__all__ += ["checkpoint_cost", "fitted_optimum", "sweep_checkpoint_interval", "at_scale", "ScaleStep", "simulate_step"]
__all__ += ["compression", "DGC", "PowerSGD", "QSGD", "Quantize", "TernGrad", "TopK", "DiLoCo", "LocalSGD", "evaluate",
            "train_local", "Logistic", "train_async", "train_sync", "OneBitAdam", "train_onebit_adam",
            "SparseLogistic", "train_hogwild"]
