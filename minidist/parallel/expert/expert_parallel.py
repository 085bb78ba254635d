"""Expert parallelism: the experts live on different devices and the tokens travel (chapter 18, lab 12).

Routing is sparse: a token needs k of the E experts, so the E experts can be spread over ``ep``
devices (``E / ep`` each) and each token sent only where its experts are. One MoE layer becomes

1. **count exchange**: every rank all-gathers the (k, E) table of how many of its tokens chose each
   expert as first, second, ... choice. From the same table every rank computes the same capacity
   quotas (``moe.quotas``), so each knows which of its own assignments survive and how many rows it
   will send to and receive from every other rank: the split sizes of the next two steps.
2. **dispatch**: one all-to-all with uneven splits moves each kept assignment's token row to the
   rank of its expert (rows for rank q grouped by expert, tokens in order);
3. the local experts run on the rows they received, from every rank;
4. **combine**: the reverse all-to-all returns the outputs to the ranks the tokens came from, where
   they are weighted by their gates and summed.

Each all-to-all sends, per rank, the rows whose expert lives elsewhere: with balanced routing
(ep-1)/ep of the rank's T k rows, so 2 (ep-1)/ep T k h elements per layer forward (dispatch +
combine) and as much again backward, where each all-to-all's adjoint is the reverse all-to-all.

The count exchange runs over the ranks whose tokens form one batch (the ``count_group``: the ep
group, or the dp x ep group when expert parallelism is combined with data parallelism), so tokens
are dropped exactly as one device holding the whole batch would drop them (with micro-batches: the global
micro-batch, each counted when its forward runs). Expert gradients are
reduced only over the replicas of the same experts (the dp group); every other parameter over
the dp x ep group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minidist import dist
from minidist.autograd import Function
from minidist.autograd import functional as F
from minidist.autograd.shape_only import c_order
from minidist.collectives import offered
from minidist.nn.module import Module
from minidist.nn.moe import LocalRouting, MoE


@dataclass(frozen=True)
class EPGroup:
    """This rank's expert-parallel group (``group``, ``size``, ``rank``) and the group whose tokens
    share the capacity (``count_group``, in which the ep members sit at ``members``).

    With ``size == 1`` and no count group nothing is communicated.
    """

    group: object = None
    size: int = 1
    rank: int = 0
    count_group: object = None
    count_size: int = 1
    count_rank: int = 0
    members: tuple[int, ...] = (0,)
    algorithm: str | None = None

    @classmethod
    def of(cls, group=None, count_group=None, algorithm: str | None = None) -> EPGroup:
        """Inside ``md.launch``: ``group`` (None: all ranks) holds the experts; ``count_group``
        (default ``group``) the ranks whose tokens make one batch. It must contain ``group``."""
        ranks = tuple(group.ranks) if group is not None else tuple(range(dist.get_world_size()))
        count_group = group if count_group is None else count_group
        cranks = tuple(count_group.ranks) if count_group is not None else tuple(range(dist.get_world_size()))
        missing = [r for r in ranks if r not in cranks]
        if missing:
            raise ValueError(f"expert parallel: the count group {list(cranks)} must contain the ep group "
                             f"{list(ranks)} (missing {missing})")
        return cls(group, len(ranks), dist.get_rank(group), count_group, len(cranks), dist.get_rank(count_group),
                   tuple(cranks.index(r) for r in ranks), algorithm)

    def experts(self, n_experts: int, rank: int | None = None) -> range:
        """Global ids of the experts on ep rank ``rank`` (this rank by default): a contiguous block."""
        if n_experts % self.size:
            raise ValueError(f"expert parallel: {n_experts} experts cannot be split evenly over ep={self.size} ranks")
        per = n_experts // self.size
        r = self.rank if rank is None else rank
        return range(r * per, (r + 1) * per)


class AllToAll(Function):
    """Rows to other ranks by ``send`` split sizes, ``recv`` rows back; the adjoint swaps the splits."""

    @staticmethod
    def forward(ctx, x, send, recv, ep):
        ctx.args = (send, recv, ep)
        return _all_to_all(x.data, send, recv, ep)

    @staticmethod
    def backward(ctx, g):
        send, recv, ep = ctx.args
        return _all_to_all(g.data, recv, send, ep), None, None, None


def _all_to_all(x: np.ndarray, send: list[int], recv: list[int], ep: EPGroup) -> np.ndarray:
    out = np.empty((sum(recv),) + x.shape[1:], dtype=x.dtype, like=x)  # shape-only in, shape-only out
    dist.all_to_all_single(out, c_order(x), recv, send, group=ep.group,
                           algorithm=offered("all_to_all", ep.algorithm))
    return out


class ExpertParallelRouting(LocalRouting):
    """Count exchange, all-to-all dispatch, local experts, all-to-all combine (see the module docstring)."""

    def __init__(self, ep: EPGroup) -> None:
        self.ep = ep
        self.last: dict = {}

    def gather_counts(self, counts: np.ndarray) -> tuple[np.ndarray, int]:
        ep = self.ep
        if ep.count_size == 1:
            return counts[None], 0
        src = np.ascontiguousarray(counts, dtype=np.int64)
        out = np.empty((ep.count_size,) + src.shape, dtype=np.int64)
        dist.all_gather_into_tensor(out, src, group=ep.count_group, algorithm=offered("all_gather", ep.algorithm))
        return out, ep.count_rank

    def run_experts(self, moe: MoE, xs, kept: np.ndarray, me: int):
        ep = self.ep
        E, p = moe.n_experts, ep.size
        table = kept[list(ep.members)]  # (p, E): kept rows of every ep rank for every expert
        blocks = [ep.experts(E, q) for q in range(p)]
        mine = blocks[ep.rank]
        send = [int(table[ep.rank, b.start:b.stop].sum()) for b in blocks]
        recv = [int(table[s, mine.start:mine.stop].sum()) for s in range(p)]
        self.last = {"send_rows": send, "recv_rows": recv}
        got = AllToAll.apply(xs, send, recv, ep) if p > 1 else xs
        # received: for each source, its rows for each of my experts; regroup expert by expert
        local = table[:, mine.start:mine.stop]  # (p, E/ep)
        offsets = np.concatenate([[0], np.cumsum(local.reshape(-1))])[:-1].reshape(local.shape)
        perm = np.concatenate([np.arange(offsets[s, j], offsets[s, j] + local[s, j])
                               for j in range(len(mine)) for s in range(p)] + [np.zeros(0, np.int64)]).astype(np.int64)
        if len(perm) == 0:
            out = got
        else:
            grouped = got[perm]
            outs, lo = [], 0
            for j, e in enumerate(mine):
                n = int(local[:, j].sum())
                if n:
                    outs.append(moe.experts[e](grouped[lo:lo + n]))
                lo += n
            out = F.cat(outs, 0)[np.argsort(perm)]  # back to the order the rows arrived in
        return AllToAll.apply(out, recv, send, ep) if p > 1 else out


class LocalExperts(Module):
    """The experts one rank holds, registered under their global ids so parameter names stay global."""

    def __init__(self, experts, ids: range) -> None:
        super().__init__()
        self.ids = ids
        for e in ids:
            setattr(self, str(e), experts[e])

    def __getitem__(self, e: int) -> Module:
        if e not in self.ids:
            raise IndexError(f"expert parallel: expert {e} is not on this rank (it holds experts "
                             f"{self.ids.start}..{self.ids.stop - 1})")
        return getattr(self, str(e))

    def __len__(self) -> int:
        return len(self.ids)


def expert_parallelize(model, ep: EPGroup, placement=None):
    """Keep only this rank's experts in every MoE layer of ``model`` and route tokens across ``ep``;
    returns the model. Non-expert weights stay replicated. ``placement`` (``token_index(n)``, e.g. the rank's
    ``BatchShare``) says where the rank's tokens sit in the global batch, which a planned route
    (``GPTConfig.expert_load``) is a function of; None: the rank's tokens are numbered from 0."""
    for m in list(model.modules()):
        if isinstance(m, MoE):
            m.experts = LocalExperts(m.experts, ep.experts(m.n_experts))
            m.routing = ExpertParallelRouting(ep)
            if placement is not None:
                m.placement = placement
    return model
