"""Parallel training on simulated devices: the strategies, and ``parallelize``/``train`` that compose them.

How a run is put together (Part VI): ``config`` (ParallelConfig, one description of a layout),
``mesh`` (build_mesh: the only rank arithmetic), ``refusals`` (the layouts refused up front, and why),
``parallelize`` (every strategy applied to one model in one documented order), ``engine`` (a step's
micro-batches, one after another or as a pipeline schedule) and ``train`` (the one rank loop,
``md.parallel.train``).

Data parallelism and its memory savings (chapters 14, 19-22): ``data_parallel`` (DDP: broadcast,
buckets, async all-reduce, no_sync), ``zero`` (stages 1-2), ``fsdp`` (stage 3 and FSDP: sharded
weights gathered per layer), ``expert_data_parallel`` (dense and expert gradient groups side by
side), ``flat`` (padded flat parameters), ``flat_optim`` (the elementwise update on any shard),
``recompute`` (activation checkpointing), ``offload`` (host tier), ``memory`` (ledger accounting),
``runner`` (a micro-batch's forward and backward with the strategies' hooks).

Tensor parallelism (chapter 15): ``tensor_parallel`` (TPGroup, the conjugate f/g operators and their
sequence-parallel halves), ``parallel_linear`` (column/row-parallel linears), ``sequence_parallel`` (norms, dropout and
positions on sequence shards), ``vocab_parallel`` (embedding, head, cross-entropy split by
vocabulary), ``tensor_parallel_model`` (attention, MLP and ``tensor_parallelize(GPT)``), ``tp_overlap`` (the
sequence-parallel collectives cut into ring steps hidden behind their matmuls).

Pipeline parallelism (chapter 16): ``schedules`` (schedules as data: GPipe, 1F1B, interleaved, ZB-H1;
the checker and simulator), ``dualpipe`` (DualPipeV, the pipeline folded into a V), ``split_backward``
(input- and weight-gradient passes for zero bubble),
``pipeline`` (stage partitioning and the executor that runs any schedule).

Context and expert parallelism (chapters 17-18): ``online_softmax`` (the (m, s, o) state, its associative
merge, blockwise attention), ``context_parallel`` (ring attention, zigzag layout, Ulysses),
``expert_parallel`` (count exchange, all-to-all dispatch and combine).

At scale (chapter 34): ``at_scale`` (one step of a published run on thousands of simulated GPUs, shape-only, one
rank per pipeline stage).
"""

from minidist.parallel.config import ParallelConfig
from minidist.parallel.flat import FlatUnit
from minidist.parallel.memory import graph_bytes, state_bytes_per_param
from minidist.parallel.mesh import build_mesh
from minidist.parallel.parallelize import Parallelized, parallelize, split_sizes
from minidist.parallel.train import TrainResult, train

# isort: split
from minidist.parallel.parallel_linear import ColumnParallelLinear, RowParallelLinear
from minidist.parallel.tensor_parallel import TPGroup
from minidist.parallel.tensor_parallel_model import tensor_parallelize
from minidist.parallel.tp_overlap import all_gather_matmul, matmul_reduce_scatter
from minidist.parallel.vocab_parallel import VocabParallelEmbedding, vocab_parallel_cross_entropy

# isort: split
from minidist.parallel import dualpipe, pipeline, schedules
from minidist.parallel.pipeline import PipelineExecutor, measure_schedule
from minidist.parallel.pipeline_stages import partition
from minidist.parallel.schedule_walk import check_schedule, simulate
from minidist.parallel.schedules import Schedule, ScheduleError, make_schedule

# isort: split
from minidist.parallel.context_parallel import CPGroup, context_parallelize, ring_attention, ulysses_attention
from minidist.parallel.expert_parallel import EPGroup, expert_parallelize
from minidist.parallel.online_softmax import blockwise_attention

# isort: split
from minidist.parallel.checkpoint_sweep import checkpoint_cost, fitted_optimum, sweep_checkpoint_interval

# isort: split
from minidist.parallel import at_scale
from minidist.parallel.at_scale import ScaleStep, simulate_step

# isort: split
from minidist.parallel import compression
from minidist.parallel.async_sgd import Logistic, train_async, train_sync
from minidist.parallel.compression import DGC, QSGD, PowerSGD, Quantize, TernGrad, TopK
from minidist.parallel.hogwild import SparseLogistic, train_hogwild
from minidist.parallel.local_sgd import DiLoCo, LocalSGD, evaluate, train_local
from minidist.parallel.onebit_adam import OneBitAdam, train_onebit_adam

__all__ = ["FlatUnit", "ParallelConfig", "Parallelized", "TrainResult", "build_mesh", "graph_bytes", "parallelize",
           "split_sizes", "state_bytes_per_param", "train"]
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
