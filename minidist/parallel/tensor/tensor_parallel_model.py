"""A GPT split over a tensor-parallel group: attention by heads, the MLP by its hidden features, the
vocabulary by rows (Megatron-LM; chapter 15 and chapter 17's sequence parallelism, lab 09).

``tensor_parallelize(GPT(config, seed), tp)`` turns the model every rank built from the same seed
into this rank's share: each matrix keeps its block, nothing else changes name, so a checkpoint
or an optimizer sees ``blocks.0.attn.wq.weight`` as before, only smaller. Per layer and
micro-batch the group does 2 all-reduces forward and 2 backward (``g`` after attention and after
the MLP; ``f`` before each), or with sequence parallelism 2 all-gathers and 2 reduce-scatters
forward and their mirror images backward, plus the all-gathers that rebuild the column layers'
inputs. The embedding adds one ``g`` forward, the head one ``f`` backward, and the
vocabulary-parallel cross-entropy two all-reduces of per-token scalars. A mixture-of-experts layer
stays whole on every tp rank: its input is replicated there, and expert parallelism (not tp) is
what splits the experts.
"""

from __future__ import annotations

import numpy as np

from minidist.autograd import functional as F
from minidist.nn.attention import CausalSelfAttention
from minidist.nn.gpt import GPT, Block, TiedHead
from minidist.nn.layers import Linear
from minidist.nn.mlp import MLP
from minidist.nn.module import Module
from minidist.nn.moe import MoE
from minidist.parallel.tensor.parallel_linear import (
    ColumnParallelLinear,
    RowParallelLinear,
    _ParallelLinear,
    column_parallel,
)
from minidist.parallel.tensor.sequence_parallel import (
    SequenceParallelDropout,
    SequenceParallelPositions,
    adopt,
    replicated_scope,
    sequence_parallel_norm,
)
from minidist.parallel.tensor.tensor_parallel import TPGroup
from minidist.parallel.tensor.vocab_parallel import (
    TiedVocabParallelHead,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)


class TensorParallelAttention(Module):
    """Causal self-attention on this rank's ``n_heads / t`` query heads and ``n_kv_heads / t`` kv heads.

    Heads are contiguous column blocks of wq, wk, wv and row blocks of wo, and query head h reads
    kv head ``h // (n_heads / n_kv_heads)``, so rank r's query heads find their kv heads on rank r.
    """

    def __init__(self, attn: CausalSelfAttention, tp: TPGroup) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim, self.tp = attn.n_heads, attn.n_kv_heads, attn.head_dim, tp
        self.wq = ColumnParallelLinear.from_dense(attn.wq, tp)
        self.wk = ColumnParallelLinear.from_dense(attn.wk, tp)
        self.wv = ColumnParallelLinear.from_dense(attn.wv, tp)
        self.wo = RowParallelLinear.from_dense(attn.wo, tp)
        self.core = attn.core

    def forward(self, x):
        """``self.core(q, k, v)`` attends over the local heads (the seam selective recomputation wraps)."""
        q, k, v = column_parallel(x, [self.wq, self.wk, self.wv], self.tp)
        B, T = q.shape[0], q.shape[1]  # with sequence parallelism T is the whole sequence, x held a slice
        hd = self.head_dim
        q = q.reshape(B, T, -1, hd).transpose(0, 2, 1, 3)
        k = k.reshape(B, T, -1, hd).transpose(0, 2, 1, 3)
        v = v.reshape(B, T, -1, hd).transpose(0, 2, 1, 3)
        y = self.core(q, k, v)
        return self.wo(y.transpose(0, 2, 1, 3).reshape(B, T, q.shape[1] * hd))

    def extra_repr(self) -> str:
        t = self.tp.size
        return f"heads {self.n_heads}/{t}, kv heads {self.n_kv_heads}/{t}, head_dim={self.head_dim}"


class TensorParallelMLP(Module):
    """Column-parallel in (fc1, or w_gate and w_up), the activation on the local block, row-parallel out."""

    def __init__(self, mlp: MLP, tp: TPGroup) -> None:
        super().__init__()
        self.kind, self.tp = mlp.kind, tp
        if mlp.kind == "gelu":
            self.fc1 = ColumnParallelLinear.from_dense(mlp.fc1, tp)
            self.fc2 = RowParallelLinear.from_dense(mlp.fc2, tp)
        else:
            self.w_gate = ColumnParallelLinear.from_dense(mlp.w_gate, tp)
            self.w_up = ColumnParallelLinear.from_dense(mlp.w_up, tp)
            self.w_down = RowParallelLinear.from_dense(mlp.w_down, tp)

    def forward(self, x):
        if self.kind == "gelu":
            (h,) = column_parallel(x, [self.fc1], self.tp)
            return self.fc2(F.gelu(h, approximate="tanh"))
        gate, up = column_parallel(x, [self.w_gate, self.w_up], self.tp)
        return self.w_down(F.silu(gate) * up)


class TensorParallelBlock(Block):
    """The pre-norm block, unchanged, with the sequence-parallel parameters' gradients reduced together."""

    tp: TPGroup

    def forward(self, x):
        out = None if isinstance(self.mlp, MoE) else self.mlp.fc2 if self.mlp.kind == "gelu" else self.mlp.w_down
        params = [self.ln1.weight, getattr(self.ln1, "bias", None), self.ln2.weight, getattr(self.ln2, "bias", None),
                  self.attn.wo.bias, getattr(out, "bias", None)]
        with replicated_scope(self.tp, params):
            return super().forward(x)


class TensorParallelGPT(GPT):
    """``GPT`` whose logits are this rank's vocabulary slice and whose loss is the vocabulary-parallel one."""

    tp: TPGroup

    def criterion(self, logits, targets):
        return vocab_parallel_cross_entropy(logits, targets, self.tp)


def check_divisible(config, tp: int, sequence_parallel: bool = False) -> None:
    """Raise one clear error listing every size of ``config`` that ``tp`` does not divide."""
    sizes = {"n_heads": config.n_heads, "n_kv_heads": config.n_kv_heads, "d_ff": config.d_ff,
             "vocab_size": config.vocab_size}
    if sequence_parallel:
        sizes["seq_len"] = config.seq_len
    bad = [f"{k}={v}" for k, v in sizes.items() if v % tp]
    if bad:
        raise ValueError(f"tensor parallel: tp={tp} must divide {', '.join(bad)} (each rank takes an equal block)")


def _swap(parent: Module, name: str, new: Module) -> None:
    """Replace a child module in place, keeping its position (so parameter order is unchanged)."""
    parent._modules[name] = new
    object.__setattr__(parent, name, new)


def tensor_parallelize(model: GPT, tp: TPGroup) -> TensorParallelGPT:
    """This rank's tensor-parallel share of ``model`` (which is consumed: its modules are reused).

    Every rank must pass a model built from the same seed. Dropout outside the split matmuls uses
    the model's own generator, so the masks agree across ranks (a synchronised seed) and, with
    sequence parallelism, each rank applies its slice of the single-device mask.
    """
    if not isinstance(model, GPT) or isinstance(model, TensorParallelGPT):
        raise TypeError(f"tensor_parallelize: expected a dense GPT, got {type(model).__name__}")
    if getattr(model.config, "n_experts", 0) and tp.sequence_parallel:
        raise ValueError("tensor_parallelize: a mixture-of-experts layer on a sequence shard would route only its "
                         "shard's tokens (capacity and losses of another batch); use sequence_parallel=False")
    if getattr(model.config, "kv_latent", None) is not None:
        raise ValueError(f"tensor_parallelize: latent attention (kv_latent={model.config.kv_latent}) has no "
                         "tensor-parallel version: heads are split as blocks of wq, wk, wv, and its shared "
                         "down-projection w_dkv is none of them")
    check_divisible(model.config, tp.size, tp.sequence_parallel)
    sp = tp.sequence_parallel
    new = adopt(TensorParallelGPT, model, tp=tp)
    for i, block in enumerate(model.blocks):
        _swap(block, "attn", TensorParallelAttention(block.attn, tp))
        if not isinstance(block.mlp, MoE):  # an MoE layer stays whole on every tp rank (ep splits experts)
            _swap(block, "mlp", TensorParallelMLP(block.mlp, tp))
        if sp:
            _swap(block, "ln1", sequence_parallel_norm(block.ln1, tp))
            _swap(block, "ln2", sequence_parallel_norm(block.ln2, tp))
            _swap(block, "drop", adopt(SequenceParallelDropout, block.drop, tp=tp))
        tb = adopt(TensorParallelBlock, block, tp=tp)
        new.blocks._list[i] = tb
        _swap(new.blocks, str(i), tb)
    _swap(new, "wte", VocabParallelEmbedding.from_dense(model.wte, tp))
    if sp:
        _swap(new, "wpe", adopt(SequenceParallelPositions, model.wpe, tp=tp))
        _swap(new, "drop", adopt(SequenceParallelDropout, model.drop, tp=tp))
        _swap(new, "ln_f", sequence_parallel_norm(model.ln_f, tp))
    if isinstance(model.lm_head, TiedHead):
        _swap(new, "lm_head", TiedVocabParallelHead(new.wte))
    else:
        _swap(new, "lm_head", ColumnParallelLinear.from_dense(model.lm_head, tp))
    return new


def shard_axes(model: Module) -> dict[str, int | None]:
    """``{parameter name: axis split across the tensor-parallel group, or None if replicated}``."""
    axes = {}
    for prefix, m in model.named_modules():
        for pname in m._parameters:
            name = f"{prefix}.{pname}" if prefix else pname
            axis = None
            if isinstance(m, _ParallelLinear):
                axis = m.shard_axis if pname == "weight" else (0 if m.bias_sharded else None)
            elif isinstance(m, VocabParallelEmbedding):
                axis = 0
            axes.setdefault(name, axis)
    return axes


def merge_shards(states: list[dict[str, np.ndarray]], axes: dict[str, int | None]) -> dict[str, np.ndarray]:
    """The full arrays from every tensor-parallel rank's arrays (in rank order)."""
    out = {}
    for name, a in states[0].items():
        axis = axes.get(name)
        out[name] = a if axis is None else np.concatenate([s[name] for s in states], axis=axis)
    return out


def dense_layers(model: Module) -> list[str]:
    """Names of plain ``Linear`` modules left in a model (a tensor-parallel GPT has none)."""
    return [name for name, m in model.named_modules() if type(m) is Linear]


def merge_tensor_parallel(out: list[dict], state_fn, replicated: bool):
    """``md.parallel.train``'s results with tensor parallelism: full parameters and gradients from
    every rank's blocks, and (replicated layouts) one full copy of the weights per data-parallel replica.

    ``out``: the ranks' reports in rank order (``tp_rank``, ``dp_rank``, ``tp_axes``, ``params``,
    ``grads``); ``state_fn(first, reports)`` assembles one tensor-parallel position's state over dp.

    With pipeline parallelism each report holds one stage's parameters: a tensor-parallel position's
    state is the union over the stages, and ``tp_axes`` (every report's, merged) covers them all.
    """
    axes, tp = {}, 1 + max(o["tp_rank"] for o in out)
    for o in out:
        axes.update(o["tp_axes"])
    by_tp = [[o for o in out if o["tp_rank"] == i] for i in range(tp)]

    def merged(key):
        return merge_shards([state_fn(g[0][key], [o[key] for o in g]) for g in by_tp], axes)

    rank_params = None
    if replicated:
        replicas = sorted({o["dp_rank"] for o in out})
        rank_params = [merge_shards([{k: v for o in g if o["dp_rank"] == d for k, v in o["params"]["full"].items()}
                                     for g in by_tp], axes) for d in replicas]
    return merged("params"), merged("grads"), rank_params
