"""Two-level all-reduce: reduce-scatter inside each node, all-reduce across nodes, all-gather inside.

Property: a sum over all ranks can be regrouped as a sum over nodes of sums within a node
(associativity and commutativity, book chapters 13 and 13a, lab 07). With G ranks on each of N nodes:

1. ring reduce-scatter among the G ranks of a node: local rank l ends with chunk l of the node's sum;
2. ring all-reduce of chunk l (n/G bytes) among the N ranks with local rank l, one per node, all G
   of them at once, each on its own network card;
3. ring all-gather inside the node.

Only n/G bytes per rank cross the slow network, instead of the flat ring's 2(p-1)/p n:

    T = 2(G-1) alpha_intra + 2(G-1)/G n/beta_intra + 2(N-1) alpha_inter + 2(N-1)/N (n/G)/beta_inter

When the group's nodes hold different numbers of its ranks there is no matching chunk layout, and
the flat ring is used instead.
"""

from __future__ import annotations

import numpy as np

from minidist.collectives import ring
from minidist.collectives.comm import Comm
from minidist.collectives.registry import register
from minidist.runtime.ops import ReduceOp


def layout(c: Comm) -> list[list[int]] | None:
    """Group ranks by node (each list in group order), or None if the nodes hold unequal numbers."""
    nodes: dict[int, list[int]] = {}
    for i in range(c.size):
        nodes.setdefault(c.node(i), []).append(i)
    per = [nodes[k] for k in sorted(nodes)]
    if len({len(members) for members in per}) != 1:
        return None
    return per


@register("all_reduce", "hierarchical")
def all_reduce(c: Comm, buf: np.ndarray, op: ReduceOp) -> None:
    per = layout(c)
    if per is None:
        ring.all_reduce(c, buf, op)
        return
    mine = next(members for members in per if c.rank in members)
    local = c.sub(mine) if len(per) > 1 else c
    chunks = ring.split(buf, len(mine))
    owned = ring.reduce_scatter_phase(local, chunks, op, shift=-1)  # local rank l owns chunk l
    if len(per) > 1:
        peers = c.sub([members[owned] for members in per])  # same local rank on every node
        ring.all_reduce(peers, chunks[owned], op)
    ring.all_gather_phase(local, chunks, shift=-1)
