"""Parallel training strategies on simulated devices, and ``train`` that composes them (Parts IV-V).

One idea per file: ``config`` (ParallelConfig), ``mesh`` (build_mesh: the only rank arithmetic), ``flat``
(padded flat parameters), ``data_parallel`` (DDP: broadcast, buckets, async all-reduce, no_sync),
``zero`` (stages 1-2), ``fsdp`` (stage 3 and FSDP: sharded weights gathered per layer),
``recompute`` (activation checkpointing), ``offload`` (host tier), ``memory`` (ledger accounting),
``flat_optim`` (the elementwise update on any shard), ``runner`` (a micro-batch's forward and
backward with the strategies' hooks) and ``train`` (``md.parallel.train``).

Tensor parallelism (issue 7): ``tensor_parallel`` (TPGroup, the conjugate f/g operators and their
sequence-parallel halves, column/row-parallel linears), ``sequence_parallel`` (norms, dropout and
positions on sequence shards), ``vocab_parallel`` (embedding, head, cross-entropy split by
vocabulary), ``tensor_parallel_model`` (attention, MLP and ``tensor_parallelize(GPT)``).

Pipeline parallelism (issue 8): ``schedules`` (schedules as data: GPipe, 1F1B, interleaved, ZB-H1;
the checker and simulator), ``split_backward`` (input- and weight-gradient passes for zero bubble),
``pipeline`` (stage partitioning and the executor that runs any schedule), ``pipeline_train``
(``train`` with ``pp > 1``, also with tensor parallelism inside the stages).

Context and expert parallelism (issue 9): ``online_softmax`` (the (m, s, o) state, its associative
merge, blockwise attention), ``context_parallel`` (ring attention, zigzag layout, Ulysses),
``expert_parallel`` (count exchange, all-to-all dispatch and combine), ``cp_ep_train`` (both inside
``train``).
"""

from minidist.parallel.config import ParallelConfig
from minidist.parallel.flat import FlatUnit
from minidist.parallel.memory import graph_bytes, state_bytes_per_param
from minidist.parallel.mesh import build_mesh
from minidist.parallel.train import TrainResult, split_sizes, train

# isort: split
from minidist.parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear, TPGroup
from minidist.parallel.tensor_parallel_model import tensor_parallelize
from minidist.parallel.vocab_parallel import VocabParallelEmbedding, vocab_parallel_cross_entropy

# isort: split
from minidist.parallel import pipeline, schedules
from minidist.parallel.pipeline import PipelineExecutor, measure_schedule, partition
from minidist.parallel.schedules import Schedule, ScheduleError, check_schedule, make_schedule, simulate

# isort: split
from minidist.parallel.context_parallel import CPGroup, context_parallelize, ring_attention, ulysses_attention
from minidist.parallel.expert_parallel import EPGroup, expert_parallelize
from minidist.parallel.online_softmax import blockwise_attention

__all__ = ["FlatUnit", "ParallelConfig", "build_mesh", "TrainResult", "graph_bytes", "split_sizes",
           "state_bytes_per_param", "train"]
__all__ += ["ColumnParallelLinear", "RowParallelLinear", "TPGroup", "VocabParallelEmbedding", "tensor_parallelize",
            "vocab_parallel_cross_entropy"]
__all__ += ["CPGroup", "EPGroup", "blockwise_attention", "context_parallelize", "expert_parallelize",
            "ring_attention", "ulysses_attention"]
__all__ += ["PipelineExecutor", "Schedule", "ScheduleError", "check_schedule", "make_schedule", "measure_schedule",
            "partition", "pipeline", "schedules", "simulate"]
