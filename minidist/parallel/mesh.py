"""The device mesh of a training layout: the one place where a ParallelConfig becomes ranks and groups.

Picotron's lesson, in torch's vocabulary: every strategy asks one mesh "which group do I reduce
gradients over?", "which rank holds my shard?", instead of computing rank numbers itself. The
dimensions are ``(pp, dp, ep, cp, tp)`` with ``tp`` varying fastest, so tensor-parallel peers are
neighbours (inside one node, where the links are fast) and pipeline stages are furthest apart, as in
Megatron-LM. Dimensions of size one are kept, so every strategy finds its axis in every layout.

Three flattened groups recur, because dp, ep and cp all split the tokens of a step:

* ``BATCH = ("dp", "ep")``: ranks that take different sequences of the global batch;
* ``DENSE_GRAD = ("dp", "ep", "cp")``: the replicas of a dense weight, whose gradient is summed there;
* ``EXPERT_GRAD = ("dp", "cp")``: the replicas of an expert's weight (expert parallelism shards the
  experts over ep, so each expert lives on one ep coordinate).
"""

from __future__ import annotations

import numpy as np

from minidist import dist
from minidist.parallel.config import ParallelConfig
from minidist.runtime.groups import ProcessGroup
from minidist.runtime.mesh import DeviceMesh

AXES = ("pp", "dp", "ep", "cp", "tp")
BATCH = ("dp", "ep")
DENSE_GRAD = ("dp", "ep", "cp")
EXPERT_GRAD = ("dp", "cp")


def build_mesh(config: ParallelConfig, rank: int | None = None) -> DeviceMesh:
    """The ``(pp, dp, ep, cp, tp)`` mesh of ``config`` seen from ``rank`` (default: this rank, inside
    ``md.launch``). Outside a launch give ``rank`` to reason about a layout without running it."""
    if not isinstance(config, ParallelConfig):
        raise TypeError(f"build_mesh: config must be a ParallelConfig, got {type(config).__name__}")
    shape = tuple(getattr(config, a) for a in AXES)
    world = int(np.prod(shape))
    if rank is None:
        rank = dist.get_rank()
        if dist.get_world_size() != world:
            raise ValueError(f"build_mesh: the layout {dict(zip(AXES, shape))} needs {world} ranks, "
                             f"the launch has {dist.get_world_size()}")
    if not 0 <= rank < world:
        raise ValueError(f"build_mesh: rank {rank} is outside the {world} ranks of {dict(zip(AXES, shape))}")
    return DeviceMesh(np.arange(world).reshape(shape), AXES, rank)


SYMMETRIC = ("dp", "ep", "tp")  # and cp under Ulysses (see representatives)


def representatives(config: ParallelConfig, global_batch: int | None = None) -> list[int]:
    """``rep[r]``: the rank that stands for rank ``r`` in a shape-only run, the rank of ``r``'s pipeline stage with
    every symmetric coordinate 0.

    Property: ranks that differ only in their dp, ep or tp coordinate run the same program on arrays of the same
    shapes (each holds an equal shard, takes an equal share of the batch), so their clocks and ledgers agree;
    pipeline stages differ (the first embeds, the last computes the loss). So do the ranks of a ring-attention
    context group: under a causal mask each attends to a different number of earlier blocks (a contiguous layout
    gives the last rank the most; zigzag evens the total, not each step, nor the links of a ring that leaves a
    node), and a representative ran its step up to 10% short; every cp coordinate runs there. Ulysses' context
    ranks are alike (each holds whole sequences for its heads). With one rank per stage simulated, 16,384 ranks
    cost what 16 do.

    A ``global_batch`` that dp x ep does not divide gives the first ranks one sequence more (``split_sizes``):
    their shares differ, so every dp and ep coordinate runs then.
    """
    symmetric = SYMMETRIC + (("cp",) if config.cp_method == "ulysses" else ())
    if global_batch is not None and global_batch % (config.dp * config.ep):
        # one representative per share would pair mirrors across unlike ranks, which the transport cannot
        symmetric = tuple(a for a in symmetric if a not in BATCH)
    shape = tuple(getattr(config, a) for a in AXES)
    grid = np.arange(int(np.prod(shape))).reshape(shape)
    index = tuple(slice(None) if a not in symmetric else slice(0, 1) for a in AXES)
    return np.broadcast_to(grid[index], shape).reshape(-1).tolist()


def pipeline_ends(mesh: DeviceMesh) -> ProcessGroup | None:
    """The first and the last stage of this rank's pipeline (both hold tied embeddings), if this rank
    is one of them and pp > 1; else None."""
    ranks = mesh.get_group("pp").ranks
    if len(ranks) < 2 or mesh.rank not in (ranks[0], ranks[-1]):
        return None
    return ProcessGroup([ranks[0], ranks[-1]])
