"""Tensor parallelism: each matrix split across devices, Megatron style (chapters 15, 17 and 30).

Property: the linearity of matrix multiplication. ``X [W_1 | ... | W_t] = [X W_1 | ... | X W_t]`` and
``[X_1 | ... | X_t] [W_1; ...; W_t] = sum_i X_i W_i``, so a column-parallel layer followed by a row-parallel one
needs a single all-reduce (``tensor_parallel``: TPGroup and the conjugate f/g operators; ``parallel_linear``:
column- and row-parallel linears). Positionwise layers split along the sequence instead
(``sequence_parallel``), the vocabulary by rows (``vocab_parallel``), a whole GPT by heads and hidden features
(``tensor_parallel_model``), and a matrix product is separable by blocks of rows, so its collective can be cut
into ring steps hidden behind the matmul (``tp_overlap``).

Read by lab 09 (tensor and sequence parallelism) and lab 22 (overlap); composed by ``md.parallel.train`` in
labs 15-16.
"""

from minidist.parallel.tensor.parallel_linear import ColumnParallelLinear, RowParallelLinear
from minidist.parallel.tensor.tensor_parallel import TPGroup
from minidist.parallel.tensor.tensor_parallel_model import TensorParallelGPT, tensor_parallelize
from minidist.parallel.tensor.tp_overlap import all_gather_matmul, matmul_reduce_scatter
from minidist.parallel.tensor.vocab_parallel import VocabParallelEmbedding, vocab_parallel_cross_entropy

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "TPGroup", "TensorParallelGPT", "VocabParallelEmbedding",
           "all_gather_matmul", "matmul_reduce_scatter", "tensor_parallelize", "vocab_parallel_cross_entropy"]
