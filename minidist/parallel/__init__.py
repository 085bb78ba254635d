"""Parallel training strategies on simulated devices, and ``train`` that composes them (Parts IV-V).

One idea per file: ``config`` (ParallelConfig), ``grid`` (rank arithmetic on the mesh), ``flat``
(padded flat parameters), ``data_parallel`` (DDP: broadcast, buckets, async all-reduce, no_sync),
``zero`` (stages 1-2), ``fsdp`` (stage 3 and FSDP: sharded weights gathered per layer),
``recompute`` (activation checkpointing), ``offload`` (host tier), ``memory`` (ledger accounting),
``flat_optim`` (the elementwise update on any shard), ``runner`` (a micro-batch's forward and
backward with the strategies' hooks) and ``train`` (``md.parallel.train``).
"""

from minidist.parallel.config import ParallelConfig
from minidist.parallel.flat import FlatUnit
from minidist.parallel.grid import ParallelGrid
from minidist.parallel.memory import graph_bytes, state_bytes_per_param
from minidist.parallel.train import TrainResult, split_sizes, train

__all__ = ["FlatUnit", "ParallelConfig", "ParallelGrid", "TrainResult", "graph_bytes", "split_sizes",
           "state_bytes_per_param", "train"]
