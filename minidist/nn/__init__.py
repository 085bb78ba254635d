"""Neural-network modules on the minidist autograd: layers, attention, MLP and a GPT.

Weights of a ``Linear`` are stored (in_features, out_features): ``y = x @ W + b``.
"""

from minidist.nn import functional
from minidist.nn.attention import CausalSelfAttention, causal_attention, causal_core, repeat_kv
from minidist.nn.gpt import GPT, Block, GPTConfig, TiedHead
from minidist.nn.kv_cache import KVCache, LayerCache, kv_cache_bytes
from minidist.nn.latent_attention import LatentSelfAttention
from minidist.nn.layers import Dropout, Embedding, LayerNorm, Linear, RMSNorm
from minidist.nn.mlp import MLP
from minidist.nn.module import Module, ModuleList, Parameter, as_rng
from minidist.nn.moe import MoE, update_route_bias

__all__ = ["GPT", "MLP", "Block", "CausalSelfAttention", "Dropout", "Embedding", "GPTConfig", "KVCache", "LayerCache",
           "LatentSelfAttention", "LayerNorm", "Linear", "MoE", "Module", "ModuleList", "Parameter", "RMSNorm",
           "TiedHead", "as_rng", "causal_attention", "causal_core", "functional", "kv_cache_bytes", "repeat_kv",
           "update_route_bias"]
