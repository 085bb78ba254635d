"""Named model configurations with their published numbers and sources (book ch24, ch34-36; labs 24-25).

``model("llama3_405b")`` returns a frozen :class:`ModelConfig`. Architecture numbers and published
totals live in ``data/models.json`` (each with a source string); the Megatron 2021 GPT family
(``megatron_1p7b`` ... ``megatron_1008p0b``) is read from the Table 1 rows in
``data/megatron2021_table1.json``, the same rows the estimator is calibrated on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from minidist.estimate.flops import moe_params, transformer_params

_DATA = Path(__file__).with_name("data")


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer. ``params`` / ``active_params`` are the published totals (computed
    from the architecture when not published); ``experts`` > 1 makes it a mixture of experts."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    gated: bool
    tied: bool
    params: float
    active_params: float
    source: str
    tokens: float | None = None
    global_batch: int | None = None  # sequences per step in the published run
    experts: int = 1
    top_k: int = 1
    shared_experts: int = 0
    expert_ffn: int | None = None
    moe_layers: int | None = None
    mla_latent: int | None = None
    mla_rope: int | None = None
    published_layout: dict = field(default_factory=dict)

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def embedding_params(self) -> float:
        return (1 if self.tied else 2) * self.vocab * self.hidden

    @property
    def expert_params(self) -> float:
        """Weights in routed experts (the part EP shards): (total - active) / (1 - k/E)."""
        if not self.is_moe:
            return 0.0
        return (self.params - self.active_params) / (1 - self.top_k / self.experts)

    @property
    def dense_params(self) -> float:
        """Weights every token uses: attention, embeddings, shared experts, dense layers, routers."""
        return self.params - self.expert_params

    def architecture_params(self) -> float:
        """Total weights computed from the architecture (for checking the published figure)."""
        if not self.is_moe:
            return transformer_params(self.layers, self.hidden, self.vocab, self.ffn, self.heads, self.kv_heads,
                                      gated=self.gated, tied=self.tied)
        return moe_params(self.layers, self.hidden, self.vocab, self.expert_ffn or self.ffn, self.heads,
                          self.kv_heads, self.experts, self.top_k, self.shared_experts, gated=self.gated,
                          tied=self.tied)[0]


def _megatron_family() -> dict[str, ModelConfig]:
    rows = json.loads((_DATA / "megatron2021_table1.json").read_text())["rows"]
    out = {}
    for r in rows:
        x = r["inputs"]
        name = "megatron_" + r["id"].split("_")[-1].lower()
        out[name] = ModelConfig(
            name=name, layers=x["layers"], hidden=x["hidden"], heads=x["heads"], kv_heads=x["heads"],
            ffn=4 * x["hidden"], vocab=x["vocab"], seq_len=x["seq_len"], gated=False, tied=True,
            params=x["params_billion"] * 1e9, active_params=x["params_billion"] * 1e9, source=r["source"],
            global_batch=x["global_batch_seqs"],
            published_layout={"gpus": x["gpus"], "cluster": "dgx-a100", "tp": x["TP"], "pp": x["PP"], "dp": x["DP"],
                              "tflops_per_gpu": r["value"]})
    return out


def _load() -> dict[str, ModelConfig]:
    raw = json.loads((_DATA / "models.json").read_text())["models"]
    out = {}
    for name, m in raw.items():
        m = dict(m)
        m.setdefault("active_params", m["params"])
        out[name] = ModelConfig(name=name, **m)
    out.update(_megatron_family())
    return out


MODELS: dict[str, ModelConfig] = _load()


def model(name: str) -> ModelConfig:
    """The named configuration, e.g. ``model("llama3_405b")``; ValueError lists the known names."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"model: unknown name {name!r}; known: {sorted(MODELS)}") from None
