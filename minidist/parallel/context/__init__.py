"""Context parallelism: attention over a sequence no device holds whole (chapter 17).

Property: associativity. Softmax attention over key blocks is not a sum of the blocks' outputs, but each
block's (max, denominator, output) state merges with another's by an associative operation
(``online_softmax``), so keys can arrive block by block around a ring (``context_parallel``: ring attention,
the zigzag layout that balances causal work); and attention mixes positions but never heads, so an all-to-all
can trade the sequence shard for a head shard (``ulysses``).

Read by lab 11 (sequence and context parallelism); composed by ``md.parallel.train`` in lab 16.
"""

from minidist.parallel.context.context_parallel import CPGroup, context_parallelize, ring_attention
from minidist.parallel.context.online_softmax import blockwise_attention
from minidist.parallel.context.ulysses import ulysses_attention

__all__ = ["CPGroup", "blockwise_attention", "context_parallelize", "ring_attention", "ulysses_attention"]
