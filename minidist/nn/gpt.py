"""A GPT in one file: configuration, the pre-norm transformer block, and the model.

``GPT(config, seed)`` draws every weight from one ``np.random.Generator(seed)`` in a fixed order,
so every rank that builds it gets the same bytes and can keep only its shard. Weights follow
GPT-2: normal(0, 0.02), with the two matrices that write into the residual stream (attention's
``wo`` and the MLP's output) scaled by 1/sqrt(2 n_layers) so the residual variance does not grow
with depth.

Attention is chosen by the config (book ch. 31a): ``n_kv_heads`` groups the key/value heads (GQA,
MQA), ``kv_latent`` reads keys and values out of a small per-token latent (MLA,
``latent_attention.py``) and ``window`` limits each query to its last ``window`` keys (sliding-window
attention). ``GPT.generate(cache=True)`` decodes with a ``KVCache`` holding what each of them keeps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from minidist.autograd import functional as F
from minidist.autograd import no_grad
from minidist.autograd.attention import check_window
from minidist.nn.attention import CausalSelfAttention
from minidist.nn.kv_cache import KVCache
from minidist.nn.latent_attention import LatentSelfAttention
from minidist.nn.layers import Dropout, Embedding, LayerNorm, Linear, RMSNorm
from minidist.nn.mlp import MLP
from minidist.nn.module import Module, ModuleList
from minidist.nn.moe import BALANCE, MoE, aux_loss

_MLPS = ("gelu", "swiglu")
_NORMS = ("layernorm", "rmsnorm")


@dataclass
class GPTConfig:
    """The shape of a GPT. ``n_kv_heads`` defaults to ``n_heads`` (plain multi-head attention);
    ``d_ff`` defaults to 4 d_model for GELU and to 8/3 d_model rounded up to a multiple of 8 for
    SwiGLU (about the same parameter count).

    ``window``: None is full causal attention; w lets query i attend to the w keys i - w < j <= i,
    itself included (sliding-window attention, Mistral's convention). ``kv_latent``: None is ordinary
    multi-head/grouped-query attention; c makes every layer multi-head latent attention with a
    c-number key/value latent per token (DeepSeek-V2), which needs ``n_kv_heads == n_heads``; with it
    ``q_latent``, ``qk_head_dim``, ``v_head_dim`` and ``rope_dim`` give DeepSeek-V3's query latent, head
    widths and decoupled (here unrotated) key, as ``LatentSelfAttention`` describes.

    ``dense_layers``: with ``n_experts``, the first ``dense_layers`` blocks keep a dense MLP of ``dense_d_ff``
    (default ``d_ff``) and the rest are mixtures of experts (DeepSeek-V3: 3 dense of 61)."""

    vocab_size: int
    seq_len: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int | None = None
    d_ff: int | None = None
    mlp: str = "gelu"
    norm: str = "layernorm"
    dropout: float = 0.0
    bias: bool = True
    tie_embeddings: bool = False
    dtype: str = "float32"
    # mixture of experts (chapter 18): n_experts = 0 keeps the dense MLP
    n_experts: int = 0
    top_k: int = 2
    capacity_factor: float | None = None
    shared_expert: bool = False
    aux_loss_coef: float = 0.01
    z_loss_coef: float = 0.001
    moe_balance: str = "aux_loss"  # or "bias": DeepSeek-V3's auxiliary-loss-free routing biases (set aux_loss_coef=0)
    bias_update: float = 1e-3  # with moe_balance="bias": how far each bias moves per step
    # None: the router chooses; "balanced" or E fractions: tokens dealt to experts by plan (nn.moe.planned_experts),
    # the routing a run without values can do (md.parallel.Backend(shape_only=True))
    expert_load: str | tuple | None = None
    dense_layers: int = 0  # with n_experts: the first dense_layers blocks keep a dense MLP (DeepSeek-V3: 3)
    dense_d_ff: int | None = None  # their hidden width (default d_ff)
    # attention architecture (chapter 31a)
    window: int | None = None
    kv_latent: int | None = None
    q_latent: int | None = None  # MLA's query latent (DeepSeek-V3: 1536)
    qk_head_dim: int | None = None  # MLA's per-head query/key width (default d_model / n_heads; V3: 128)
    v_head_dim: int | None = None  # MLA's per-head value width (default qk_head_dim; V3: 128)
    rope_dim: int = 0  # MLA's decoupled key width (V3: 64), not rotated here (no RoPE in minidist)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "d_model", "n_layers", "n_heads"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"GPTConfig: {name} must be >= 1, got {getattr(self, name)}")
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.n_kv_heads < 1:
            raise ValueError(f"GPTConfig: n_kv_heads must be >= 1, got {self.n_kv_heads}")
        if self.d_model % self.n_heads and self.qk_head_dim is None:
            raise ValueError(f"GPTConfig: d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"GPTConfig: n_heads ({self.n_heads}) must be divisible by "
                             f"n_kv_heads ({self.n_kv_heads})")
        if self.mlp not in _MLPS:
            raise ValueError(f"GPTConfig: mlp must be one of {_MLPS}, got {self.mlp!r}")
        if self.norm not in _NORMS:
            raise ValueError(f"GPTConfig: norm must be one of {_NORMS}, got {self.norm!r}")
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model if self.mlp == "gelu" else 8 * math.ceil(8 * self.d_model / 3 / 8)
        if self.d_ff < 1:
            raise ValueError(f"GPTConfig: d_ff must be >= 1, got {self.d_ff}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig: dropout must lie in [0, 1), got {self.dropout}")
        if self.n_experts < 0 or (self.n_experts and not 1 <= self.top_k <= self.n_experts):
            raise ValueError(f"GPTConfig: need n_experts >= 0 and 1 <= top_k <= n_experts, got "
                             f"n_experts={self.n_experts}, top_k={self.top_k}")
        if self.moe_balance not in BALANCE:
            raise ValueError(f"GPTConfig: moe_balance must be one of {BALANCE}, got {self.moe_balance!r}")
        self.window = check_window(self.window, "GPTConfig")
        if not 0 <= self.dense_layers <= (self.n_layers if self.n_experts else 0):
            raise ValueError(f"GPTConfig: dense_layers must lie in [0, n_layers] and needs n_experts, got "
                             f"dense_layers={self.dense_layers}, n_layers={self.n_layers}, n_experts={self.n_experts}")
        if self.dense_d_ff is None:
            self.dense_d_ff = self.d_ff
        mla = {"q_latent": self.q_latent, "qk_head_dim": self.qk_head_dim, "v_head_dim": self.v_head_dim,
               "rope_dim": self.rope_dim or None}
        if self.kv_latent is None and any(v is not None for v in mla.values()):
            raise ValueError(f"GPTConfig: {', '.join(k for k, v in mla.items() if v is not None)} shape latent "
                             f"attention and need kv_latent")
        if self.kv_latent is not None:
            if isinstance(self.kv_latent, bool) or not isinstance(self.kv_latent, (int, np.integer)) \
                    or self.kv_latent < 1:
                raise ValueError(f"GPTConfig: kv_latent must be None or an int >= 1, got {self.kv_latent!r}")
            if self.n_kv_heads != self.n_heads:
                raise ValueError(f"GPTConfig: kv_latent gives every query head its own key and value head; "
                                 f"n_kv_heads ({self.n_kv_heads}) must equal n_heads ({self.n_heads})")
        if np.dtype(self.dtype).kind != "f":
            raise ValueError(f"GPTConfig: dtype must be a floating-point type, got {self.dtype!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads if self.qk_head_dim is None else self.qk_head_dim

    def is_moe(self, layer: int) -> bool:
        """Whether block ``layer`` (0-based) holds a mixture of experts rather than a dense MLP."""
        return bool(self.n_experts) and layer >= self.dense_layers

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.dense_layers if self.n_experts else 0


def make_norm(config: GPTConfig) -> Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.d_model, dtype=config.dtype)
    return LayerNorm(config.d_model, bias=config.bias, dtype=config.dtype)


def make_ffn(config: GPTConfig, rng: np.random.Generator, std: float, out_std: float, layer: int = -1) -> Module:
    """The feed-forward module of block ``layer``: the dense MLP (of ``dense_d_ff`` among the first
    ``dense_layers``), or a mixture of experts when n_experts > 0 (``layer`` -1: an expert layer)."""
    if 0 <= layer < config.dense_layers:
        return MLP(config.d_model, config.dense_d_ff, config.mlp, config.bias, rng=rng, init_std=std,
                   out_std=out_std, dtype=config.dtype)
    if config.n_experts:
        return MoE(config.d_model, config.d_ff, config.n_experts, config.top_k, config.capacity_factor, config.mlp,
                   config.bias, config.shared_expert, config.aux_loss_coef, config.z_loss_coef,
                   balance=config.moe_balance, bias_update=config.bias_update, expert_load=config.expert_load,
                   rng=rng, init_std=std,
                   out_std=out_std, dtype=config.dtype)
    return MLP(config.d_model, config.d_ff, config.mlp, config.bias, rng=rng, init_std=std, out_std=out_std,
               dtype=config.dtype)


def make_attention(config: GPTConfig, rng: np.random.Generator, std: float, out_std: float) -> Module:
    """The attention module of one block: latent attention when kv_latent is set, else grouped-query."""
    if config.kv_latent is not None:
        return LatentSelfAttention(config.d_model, config.n_heads, config.kv_latent, config.bias, rng=rng,
                                   init_std=std, out_std=out_std, dtype=config.dtype, window=config.window,
                                   q_latent=config.q_latent, head_dim=config.qk_head_dim,
                                   v_head_dim=config.v_head_dim, rope_dim=config.rope_dim)
    return CausalSelfAttention(config.d_model, config.n_heads, config.n_kv_heads, config.bias, rng=rng,
                               init_std=std, out_std=out_std, dtype=config.dtype, window=config.window)


class Block(Module):
    """Pre-norm residual block: ``x + drop(attn(ln1(x)))``, then ``x + drop(mlp(ln2(x)))``."""

    def __init__(self, config: GPTConfig, rng: np.random.Generator, dropout_rng: np.random.Generator | None = None,
                 std: float = 0.02, layer: int = -1) -> None:
        super().__init__()
        out_std = std / math.sqrt(2 * config.n_layers)
        self.ln1 = make_norm(config)
        self.attn = make_attention(config, rng, std, out_std)
        self.ln2 = make_norm(config)
        self.mlp = make_ffn(config, rng, std, out_std, layer)
        self.drop = Dropout(config.dropout, dropout_rng)

    def forward(self, x, cache=None):
        """``cache``: this layer's ``LayerCache`` when decoding (only the attention reads it)."""
        h = self.ln1(x)
        x = x + self.drop(self.attn(h) if cache is None else self.attn(h, cache=cache))
        return x + self.drop(self.mlp(self.ln2(x)))


class TiedHead(Module):
    """The output projection that reuses the token embedding: ``logits = x @ wte.weight.T`` (no weights of its own)."""

    def __init__(self, embedding: Embedding) -> None:
        super().__init__()
        object.__setattr__(self, "embedding", embedding)  # not registered: the parameter belongs to wte

    def forward(self, x):
        return x @ self.embedding.weight.T


class GPT(Module):
    """Token + learned position embeddings, ``n_layers`` blocks, a final norm and the vocabulary head."""

    def __init__(self, config: GPTConfig, seed: int = 0, std: float = 0.02) -> None:
        super().__init__()
        self.config = config
        rng = np.random.default_rng(seed)
        # A separate stream for dropout, so turning dropout on does not change the weights.
        self.dropout_rng = np.random.default_rng([seed, 1])
        c = config
        self.wte = Embedding(c.vocab_size, c.d_model, rng=rng, init_std=std, dtype=c.dtype)
        self.wpe = Embedding(c.seq_len, c.d_model, rng=rng, init_std=std, dtype=c.dtype)
        self.drop = Dropout(c.dropout, self.dropout_rng)
        self.blocks = ModuleList(Block(c, rng, self.dropout_rng, std, i) for i in range(c.n_layers))
        self.ln_f = make_norm(c)
        if c.tie_embeddings:
            self.lm_head = TiedHead(self.wte)
        else:
            self.lm_head = Linear(c.d_model, c.vocab_size, bias=False, rng=rng, init_std=std, dtype=c.dtype)

    def criterion(self, logits, targets):
        """The loss of flattened logits (N, vocab) against targets (N,): mean cross-entropy. Parallel
        versions of the model (a vocabulary-parallel head) override this and nothing else."""
        return F.cross_entropy(logits, targets)

    def forward(self, idx, targets=None, cache: KVCache | None = None):
        """``idx`` (B, T) token ids -> ``(logits (B, T, vocab), loss)``; loss is None without targets.

        ``cache`` (a ``KVCache``, under no_grad): ``idx`` continues the tokens already cached, at
        positions ``cache.position`` onwards, and their keys and values join the cache."""
        idx = np.asarray(getattr(idx, "data", idx))
        if idx.ndim != 2:
            raise ValueError(f"GPT: idx must be (batch, time), got shape {idx.shape}")
        B, T = idx.shape
        start = 0 if cache is None else cache.position
        if start + T > self.config.seq_len:
            where = f"sequence length {T}" if cache is None else f"{T} token(s) after {start} cached"
            raise ValueError(f"GPT: {where} exceeds config.seq_len={self.config.seq_len}")
        x = self.drop(self.wte(idx) + self.wpe(np.arange(start, start + T)))
        if cache is None:
            for block in self.blocks:
                x = block(x)
        else:
            if len(cache.layers) != len(self.blocks):
                raise ValueError(f"GPT: a KVCache of {len(cache.layers)} layers for a model of {len(self.blocks)}")
            for block, layer in zip(self.blocks, cache.layers):
                x = block(x, cache=layer)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        targets = np.asarray(getattr(targets, "data", targets))
        if targets.shape != (B, T):
            raise ValueError(f"GPT: targets must have the shape of idx {(B, T)}, got {targets.shape}")
        loss = self.criterion(logits.reshape(B * T, -1), targets.reshape(B * T))
        if self.config.n_experts:  # the routers' load-balancing and z losses
            loss = loss + aux_loss(self)
        return logits, loss

    def generate(self, idx, n: int, temperature: float = 1.0, rng: np.random.Generator | int | None = None,
                 top_k: int | None = None, cache: bool = False) -> np.ndarray:
        """Append ``n`` sampled tokens to each row of ``idx`` (B, T); temperature 0 picks the argmax.

        Without a cache every step runs the whole (last ``seq_len`` tokens of the) text again. With
        ``cache=True`` the prompt runs once and each step runs only the new token against a
        ``KVCache``: the same tokens, but the text must fit in ``seq_len`` (the positions are learned).
        """
        idx = np.array(getattr(idx, "data", idx), dtype=np.int64)
        if idx.ndim == 1:
            idx = idx[None]
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        if cache and idx.shape[1] + n - 1 > self.config.seq_len:
            raise ValueError(f"GPT.generate: with cache=True the prompt ({idx.shape[1]} tokens) and the {n} new "
                             f"ones must fit in config.seq_len={self.config.seq_len}")
        kv = KVCache(self.config) if cache else None
        was_training = self.training
        self.eval()
        try:
            with no_grad():
                for _ in range(n):
                    if kv is None:
                        logits, _ = self(idx[:, -self.config.seq_len:])
                    else:  # the prompt on the first step, then the token just chosen
                        logits, _ = self(idx[:, kv.position:], cache=kv)
                    last = np.asarray(logits.data[:, -1, :], dtype=np.float64)
                    if temperature == 0:
                        nxt = last.argmax(-1)
                    else:
                        last = last / temperature
                        if top_k is not None and top_k < last.shape[-1]:
                            kth = np.partition(last, -top_k, axis=-1)[:, -top_k][:, None]
                            last = np.where(last < kth, -np.inf, last)
                        p = np.exp(last - last.max(-1, keepdims=True))
                        p /= p.sum(-1, keepdims=True)
                        nxt = np.array([rng.choice(len(row), p=row) for row in p])
                    idx = np.concatenate([idx, nxt[:, None]], axis=1)
        finally:
            self.train(was_training)
        return idx
