"""Lab 24's checks accept the right answers and explain the usual wrong ones."""

from __future__ import annotations

import pytest

import minidist as md
from minidist.labs import CheckFailed


def test_implied_step():
    md.labs.check_implied_step(lambda n, L, h, s, b, g, t: (6 * n + 12 * s * h * L) * b * s / (g * t * 1e12))
    with pytest.raises(CheckFailed, match="attention's score products too"):
        md.labs.check_implied_step(lambda n, L, h, s, b, g, t: 6 * n * b * s / (g * t * 1e12))
    with pytest.raises(CheckFailed, match="1e12 FLOP/s"):
        md.labs.check_implied_step(lambda n, L, h, s, b, g, t: (6 * n + 12 * s * h * L) * b * s / (g * t))


def _serving(active=False, values=True, gqa_heads=False, mla_double=False, mla_rope=True, per_sequence=False):
    """A reference serving_memory with one slip switched on."""
    def fn(m, context, batch, weight_bytes=2, cache_bytes=2):
        if m.mla_latent:
            per = (m.mla_latent + (m.mla_rope if mla_rope else 0)) * (2 if mla_double else 1)
        else:
            per = (2 if values else 1) * (m.heads if gqa_heads else m.kv_heads) * m.head_dim
        weights = (m.active_params if active else m.params) * weight_bytes
        return weights + (1 if per_sequence else batch) * context * m.layers * per * cache_bytes
    return fn


def test_serving_memory():
    md.labs.check_serving_memory(_serving())
    for slip, hint in ((dict(values=False), "a key AND a value"), (dict(gqa_heads=True), "only the key-value heads"),
                       (dict(mla_double=True), "it is not doubled"), (dict(mla_rope=False), "decoupled rotary key"),
                       (dict(active=True), "every expert's weights"), (dict(per_sequence=True), "each sequence of")):
        with pytest.raises(CheckFailed, match=hint):
            md.labs.check_serving_memory(_serving(**slip))

    def stub(m, context, batch, weight_bytes=2, cache_bytes=2):
        raise NotImplementedError

    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_serving_memory(stub)


def _reach(windows, context):
    if None in windows:
        return context
    return min(context, 1 + sum(w - 1 for w in windows))


def test_receptive_field():
    md.labs.check_receptive_field(_reach)
    with pytest.raises(CheckFailed, match="counts the position itself"):
        md.labs.check_receptive_field(lambda ws, c: min(c, sum(ws)))
    with pytest.raises(CheckFailed, match="first token of the sequence"):
        md.labs.check_receptive_field(lambda ws, c: c if None in ws else 1 + sum(w - 1 for w in ws))
    with pytest.raises(CheckFailed, match="full causal attention"):
        md.labs.check_receptive_field(lambda ws, c: min(c, 1 + sum(w - 1 for w in ws if w is not None)))
