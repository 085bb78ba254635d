"""Mixture of experts: a feed-forward layer whose parameters grow with E but whose work grows with k
(chapter 18, lab 12).

A router scores every token against ``E`` expert MLPs, keeps the ``top_k`` best (softmax
probabilities, renormalised over the chosen experts when k > 1) and sends the token to those
experts only; the output is the gate-weighted sum of their outputs. The routing is sparse, so
parameters scale with E while FLOPs per token scale with k, which is what expert parallelism
(``minidist/parallel/expert/expert_parallel.py``) exploits: experts live on different devices and the
tokens travel to them.

* **Capacity**: an expert accepts at most ``C = ceil(cf * T * k / E)`` assignments per batch of T
  tokens (per micro-batch when a step accumulates several, as Megatron-LM and DeepSeek-V3 do); the rest
  are dropped (the token keeps its residual path and the other expert's share).
  First choices are served before second choices, and within a choice earlier tokens first, so
  the dropped set does not depend on how tokens are split over devices. ``capacity_factor=None``
  drops nothing.
* **Auxiliary load-balancing loss** (Switch Transformer): ``E * sum_i f_i P_i`` with ``f_i`` the
  fraction of assignments routed to expert i (before drops, a constant) and ``P_i`` the mean router
  probability of expert i (differentiable); it equals 1 when routing is uniform and grows as
  routing collapses onto few experts.
* **Router z-loss** (ST-MoE): the mean of ``logsumexp(logits)^2``, which keeps router logits small.
* **Shared expert** (DeepSeek): an ordinary MLP every token also goes through.
* **Auxiliary-loss-free balancing** (``balance="bias"``; Wang et al. 2024, used by DeepSeek-V3): a per-expert
  bias is added to the router's probabilities *to choose* the top k, never to weight their outputs, and after
  each step every bias moves by ``bias_update`` towards balance: up for an expert that received fewer than the
  mean number of assignments, down for one that received more (``update_route_bias``). No gradient flows
  through it, so balance costs the model nothing in its loss. (DeepSeek-V3 scores with sigmoids; here the
  router's softmax probabilities take their place.) The loads are the whole batch's, the same on every rank,
  so every rank moves its biases the same way; a step of several micro-batches sums theirs (``begin_step``).

``forward`` stores ``aux_loss`` (both losses times their coefficients; GPT adds it to its loss)
and ``stats`` (per-expert loads, drops, capacity) for monitoring. How tokens reach the experts
is the job of ``self.routing``: :class:`LocalRouting` runs them all here; expert parallelism
installs a routing that exchanges counts and moves tokens with all-to-alls.
"""

from __future__ import annotations

import math

import numpy as np

from minidist.autograd import functional as F
from minidist.autograd.tensor import _const
from minidist.nn.layers import Linear
from minidist.nn.mlp import MLP
from minidist.nn.module import Module, ModuleList, as_rng


def expert_capacity(tokens: int, n_experts: int, top_k: int, capacity_factor: float | None) -> int | None:
    """C = ceil(cf * tokens * k / E) assignments per expert, or None (no limit)."""
    if capacity_factor is None:
        return None
    return math.ceil(capacity_factor * tokens * top_k / n_experts - 1e-9)


def top_k_experts(probs: np.ndarray, k: int) -> np.ndarray:
    """(N, k) expert ids in decreasing probability; ties go to the lower id (deterministic)."""
    return np.argsort(-probs, axis=-1, kind="stable")[:, :k]


def planned_experts(tokens: int, n_experts: int, top_k: int, load, index: np.ndarray | None = None) -> np.ndarray:
    """(len(index), top_k) expert ids dealt by a plan instead of the router's scores, so routing needs no values.

    ``tokens`` is the number of tokens in the whole (global) batch and ``index`` the global indices of the tokens
    to route (default: all of them, in order); a token's route is a function of its index alone, so a rank holding
    any part of the batch routes its tokens as one device holding all of it does.
    ``load="balanced"``: token i's choices are experts ``i k, i k + 1, ... (mod E)``, as even as counts allow.
    ``load`` = E fractions (summing to 1): expert e receives ``load[e]`` of the ``tokens x top_k`` assignments
    (largest remainders), dealt in expert order down the first choices, then the second, and so on; a token
    never gets one expert twice as long as no expert takes more than ``1 / top_k`` of them.
    """
    N, E, k = tokens, n_experts, top_k
    index = np.arange(N) if index is None else np.asarray(index, dtype=np.int64).reshape(-1)
    if index.size and (index.min() < 0 or index.max() >= N):
        raise ValueError(f"MoE: planned routing of token indices {int(index.min())}..{int(index.max())}, outside "
                         f"the global batch of {N} tokens")
    if isinstance(load, str):
        if load != "balanced":
            raise ValueError(f"MoE: expert_load must be 'balanced' or {E} fractions, got {load!r}")
        return (index[:, None] * k + np.arange(k)) % E
    share = np.asarray(load, dtype=np.float64)
    if share.shape != (E,) or (share < 0).any() or not np.isclose(share.sum(), 1.0):
        raise ValueError(f"MoE: expert_load must be 'balanced' or {E} non-negative fractions summing to 1, "
                         f"got {load!r}")
    exact = share * N * k
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(counts - exact, kind="stable")[:N * k - counts.sum()]] += 1
    if counts.max(initial=0) > N:
        raise ValueError(f"MoE: expert_load gives expert {int(counts.argmax())} {int(counts.max())} of {N} tokens' "
                         f"{k} choices; a token chooses an expert once, so no share may exceed 1/top_k = {1 / k:.3g}")
    # assignment (token i, choice j) is number j N + i of the deal; expert e holds the numbers of its block
    deal = np.arange(k) * N + index[:, None]
    return np.searchsorted(np.cumsum(counts), deal, side="right")


class WholeBatch:
    """Where a layer's tokens sit in the batch when it sees all of it: token i of its flattened input is token i."""

    def token_index(self, tokens: int) -> tuple[np.ndarray, int]:
        """(global index of each of the ``tokens`` local tokens, tokens in the global batch)."""
        return np.arange(tokens), tokens


def level_counts(experts: np.ndarray, n_experts: int) -> np.ndarray:
    """(k, E): how many tokens chose expert e as their j-th choice."""
    return np.stack([np.bincount(experts[:, j], minlength=n_experts) for j in range(experts.shape[1])])


def quotas(counts: np.ndarray, capacity: int | None) -> np.ndarray:
    """(R, k, E) assignments kept for every (rank, choice, expert), given all ranks' ``counts``.

    Serving order: choice 0 of every rank (rank 0's tokens first), then choice 1, and so on; an
    expert takes assignments until it has ``capacity``. Every rank computes the same table from the
    same counts, so no rank needs to ask another which of its tokens survive.
    """
    if capacity is None:
        return counts.copy()
    R, k, E = counts.shape
    flat = counts.transpose(1, 0, 2).reshape(R * k, E)  # serving order: level-major, then rank
    before = np.cumsum(flat, axis=0) - flat
    kept = np.clip(capacity - before, 0, flat)
    return kept.reshape(k, R, E).transpose(1, 0, 2)


def keep_mask(experts: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """(N, k) True for the assignments that fit: for each (choice j, expert e) the first
    ``kept[j, e]`` tokens (in token order) that chose e as their j-th choice."""
    keep = np.zeros(experts.shape, dtype=bool)
    for j in range(experts.shape[1]):
        col = experts[:, j]
        order = np.argsort(col, kind="stable")  # grouped by expert, token order inside a group
        start = np.searchsorted(col[order], np.arange(kept.shape[1]))
        rank_in_group = np.arange(len(col)) - start[col[order]]
        keep[order, j] = rank_in_group < kept[j, col[order]]
    return keep


BALANCE = ("aux_loss", "bias")


class LocalRouting:
    """Every expert on this device; the routing counts are this device's own."""

    def gather_counts(self, counts: np.ndarray) -> tuple[np.ndarray, int]:
        """(all ranks' (k, E) counts stacked (R, k, E), this rank's index)."""
        return counts[None], 0

    def run_experts(self, moe: MoE, xs, kept: np.ndarray, me: int):
        """Expert outputs for ``xs``, the kept assignments' token rows grouped by expert; ``kept`` (R, E)
        holds every rank's kept assignments per expert (this rank is row ``me``). None if ``xs`` is empty."""
        outs, lo = [], 0
        for e, n in enumerate(kept[me]):
            if n:
                outs.append(moe.experts[e](xs[lo:lo + n]))
            lo += n
        return F.cat(outs, 0) if outs else None


class MoE(Module):
    def __init__(self, d_model: int, d_ff: int, n_experts: int, top_k: int = 2, capacity_factor: float | None = None,
                 kind: str = "gelu", bias: bool = True, shared_expert: bool = False, aux_loss_coef: float = 0.01,
                 z_loss_coef: float = 0.001, renormalize: bool | None = None, balance: str = "aux_loss",
                 bias_update: float = 1e-3, expert_load=None, *,
                 rng: np.random.Generator | int | None = None, init_std: float | None = None,
                 out_std: float | None = None, dtype="float32") -> None:
        """``renormalize`` (default: when top_k > 1) divides the chosen gates by their sum. ``expert_load``: None
        routes by the router's scores; ``"balanced"`` or E fractions deal the tokens by plan (``planned_experts``),
        the gates still weighting by the router: what a run without values (shape-only) can route by. A plan reads
        each token's index in the global batch from ``self.placement`` (the whole batch here; a parallel layout
        installs the rank's batch share), so every layout routes a token as one device does."""
        super().__init__()
        if n_experts < 1 or not 1 <= top_k <= n_experts:
            raise ValueError(f"MoE: need n_experts >= 1 and 1 <= top_k <= n_experts, got n_experts={n_experts}, "
                             f"top_k={top_k}")
        if capacity_factor is not None and not capacity_factor > 0:
            raise ValueError(f"MoE: capacity_factor must be > 0 or None, got {capacity_factor}")
        if balance not in BALANCE:
            raise ValueError(f"MoE: balance must be one of {BALANCE}, got {balance!r}")
        if not bias_update >= 0:
            raise ValueError(f"MoE: bias_update must be >= 0, got {bias_update!r}")
        self.balance, self.bias_update = balance, float(bias_update)
        if expert_load is not None:
            planned_experts(1, n_experts, 1, expert_load)  # refuse a malformed plan now, not at the first batch
        self.expert_load = expert_load
        self.route_bias = np.zeros(n_experts)  # a statistic of past loads, not a parameter: no gradient
        rng = as_rng(rng)
        self.n_experts, self.top_k, self.capacity_factor = n_experts, top_k, capacity_factor
        self.aux_loss_coef, self.z_loss_coef = aux_loss_coef, z_loss_coef
        self.renormalize = top_k > 1 if renormalize is None else renormalize
        self.router = Linear(d_model, n_experts, bias=False, rng=rng, init_std=init_std, dtype=dtype)
        self.experts = ModuleList(MLP(d_model, d_ff, kind, bias, rng=rng, init_std=init_std, out_std=out_std,
                                      dtype=dtype) for _ in range(n_experts))
        self.shared = (MLP(d_model, d_ff, kind, bias, rng=rng, init_std=init_std, out_std=out_std, dtype=dtype)
                       if shared_expert else None)
        self.routing = LocalRouting()
        self.placement = WholeBatch()  # a parallel layout installs its batch share: planned routes are global
        self.aux_loss = None
        self.stats: dict = {}
        self.step: dict | None = None  # open (``begin_step``): the loads and kept assignments summed over forwards

    def forward(self, x):
        if x.ndim < 2:
            raise ValueError(f"MoE: expected input (..., d_model), got shape {tuple(x.shape)}")
        shape = x.shape
        xf = x.reshape(-1, shape[-1])
        N, E, k = xf.shape[0], self.n_experts, self.top_k
        logits = self.router(xf)
        probs = F.softmax(logits, axis=-1)
        scores = probs.data + self.route_bias if self.balance == "bias" else probs.data
        if self.expert_load is None:
            experts = top_k_experts(scores, k)  # the bias chooses; the probabilities below still weight
        else:
            index, total = self.placement.token_index(N)
            experts = planned_experts(total, E, k, self.expert_load, index)
        gates = probs[np.arange(N)[:, None], experts]
        if self.renormalize:
            gates = gates / gates.sum(axis=-1, keepdims=True)

        counts = level_counts(experts, E)
        all_counts, me = self.routing.gather_counts(counts)
        total = int(all_counts[:, 0].sum())  # tokens in the whole (micro-)batch, over every rank
        cap = expert_capacity(total, E, k, self.capacity_factor)
        kept_table = quotas(all_counts, cap)
        keep = keep_mask(experts, kept_table[me])

        # the losses: f is a count (no gradient), P the differentiable mean probability
        f = all_counts.sum(axis=(0, 1)) / (total * k)
        load = (probs.mean(axis=0) * _const(f.astype(probs.dtype))).sum() * E
        m = logits.data.max(axis=-1, keepdims=True)
        lse = (logits - _const(m)).exp().sum(axis=-1).log() + _const(m[:, 0])
        self.aux_loss = load * self.aux_loss_coef + (lse * lse).mean() * self.z_loss_coef

        # dispatch order: kept assignments grouped by expert, tokens in order inside a group
        flat_e, flat_keep = experts.reshape(-1), keep.reshape(-1)
        sel = np.nonzero(flat_keep)[0]
        order = sel[np.argsort(flat_e[sel], kind="stable")]
        per_expert = np.bincount(flat_e[sel], minlength=E)
        rows = self.routing.run_experts(self, xf[order // k], kept_table.sum(axis=1), me)
        slot = np.full(N * k, len(order))  # the dropped read a row of zeros
        slot[order] = np.arange(len(order))
        zero = _const(np.zeros((1, shape[-1]), dtype=xf.dtype))
        table = zero if rows is None else F.cat([rows, zero], 0)
        picked = table[slot.reshape(N, k)]  # (N, k, d)
        y = (picked * gates.reshape(N, k, 1)).sum(axis=1)
        if self.shared is not None:
            y = y + self.shared(xf)
        self.stats = {"load": all_counts.sum(axis=(0, 1)), "local_load": counts.sum(axis=0), "capacity": cap,
                      "kept": kept_table.sum(axis=(0, 1)), "dropped": int(N * k - flat_keep.sum()),
                      "routed": per_expert}
        if self.step is not None:
            # a checkpointed layer's recomputation counts its micro-batch again: every micro-batch's counts
            # double alike, so the bias update's signs and the idle experts stay those of the step
            for key in ("load", "kept"):
                self.step[key] = self.step.get(key, 0) + self.stats[key]
        return y.reshape(shape)

    def extra_repr(self) -> str:
        return (f"n_experts={self.n_experts}, top_k={self.top_k}, capacity_factor={self.capacity_factor}, "
                f"shared_expert={self.shared is not None}")


def begin_step(model: Module) -> None:
    """Open a step in every MoE layer of ``model``: until the next ``begin_step`` each layer sums the loads and
    kept assignments of all its forwards (a step's micro-batches), which ``update_route_bias`` and
    ``idle_expert_params`` then read. Without it they read the last forward alone (one batch per step)."""
    for m in model.modules():
        if isinstance(m, MoE):
            m.step = {}


def step_stats(m: MoE) -> dict:
    """``{"load", "kept"}`` of ``m``'s step: summed since ``begin_step``, else its last forward's ({} if none).
    Each micro-batch's counts are its whole global micro-batch's, so every rank holding a share sums the same."""
    if m.step is not None:
        return m.step
    return {k: m.stats[k] for k in ("load", "kept") if k in m.stats}


def update_route_bias(model: Module) -> None:
    """After an optimizer step: move each bias-balanced router's biases by ``bias_update`` towards the mean load
    of its step (``b_i += u sign(mean load - load_i)``; the loads summed over the step's micro-batches)."""
    for m in model.modules():
        if isinstance(m, MoE) and m.balance == "bias" and "load" in step_stats(m):
            load = np.asarray(step_stats(m)["load"], dtype=np.float64)
            m.route_bias = m.route_bias + m.bias_update * np.sign(load.mean() - load)


def aux_loss(model: Module):
    """The sum of the auxiliary losses of every MoE layer in ``model`` after its last forward (or None)."""
    losses = [m.aux_loss for m in model.modules() if isinstance(m, MoE) and m.aux_loss is not None]
    return sum(losses[1:], losses[0]) if losses else None


def idle_expert_params(model: Module) -> set[str]:
    """Names of the parameters of every expert that no kept assignment reached in the step (``step_stats``: the
    last forward, or every micro-batch since ``begin_step``).

    Routing statistics cover the whole (micro-)batch (under expert parallelism too), so every rank gets the
    same answer. Such an expert is not in the graph: its parameters get no gradient, and an optimizer
    leaves them alone (torch's rule for ``grad is None``), whatever the layout.
    """
    prefixes = tuple(f"{path}.experts.{int(e)}." if path else f"experts.{int(e)}."
                     for path, m in model.named_modules() if isinstance(m, MoE) and "kept" in step_stats(m)
                     for e in np.flatnonzero(np.asarray(step_stats(m)["kept"]) == 0))
    return {name for name, _ in model.named_parameters() if prefixes and name.startswith(prefixes)}


def is_expert_param(name: str) -> bool:
    """Whether a parameter (by name) belongs to an expert (a ``MoE.experts`` entry), i.e. is sharded over ep
    rather than replicated."""
    return ".experts." in f".{name}"
