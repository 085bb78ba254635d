"""Data parallelism and its memory savings: every rank runs the whole model on its share of the batch
(chapters 14, 20 and 28).

Property: linearity and elementwise updates. The gradient of a mean loss is the weighted sum of its shards'
gradients, so replicas that differentiate their own micro-batches agree after one all-reduce
(``data_parallel``: DDP with buckets, async all-reduce and ``no_sync``). The optimizer update is elementwise,
so each rank may own only 1/p of the model state (``flat``: padded flat buffers; ``flat_optim``: the update on
any shard; ``zero``: ZeRO stages 1-2; ``fsdp``: stage 3, the weights themselves sharded and gathered per
layer). The all-reduce only needs a sum, so what it moves can be compressed (``compression``: quantisers,
top-k, PowerSGD; ``onebit_adam``: 1-bit Adam once its variance has settled).

Read by labs 08 (data parallelism), 13 (memory and ZeRO) and 19 (gradient compression); composed with the other
strategies by ``md.parallel.train`` in labs 15-18 and 22-25.
"""

from minidist.parallel.data.compression import DGC, QSGD, CompressedDataParallel, PowerSGD, Quantize, TernGrad, TopK
from minidist.parallel.data.data_parallel import BucketedReducer, DataParallel, make_buckets
from minidist.parallel.data.flat import FlatUnit
from minidist.parallel.data.flat_optim import FlatOptimizer
from minidist.parallel.data.fsdp import ShardedModel
from minidist.parallel.data.onebit_adam import OneBitAdam, train_onebit_adam
from minidist.parallel.data.zero import ZeroOptimizer

__all__ = ["BucketedReducer", "CompressedDataParallel", "DGC", "DataParallel", "FlatOptimizer", "FlatUnit",
           "OneBitAdam", "PowerSGD", "QSGD", "Quantize", "ShardedModel", "TernGrad", "TopK", "ZeroOptimizer",
           "make_buckets", "train_onebit_adam"]
