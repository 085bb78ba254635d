"""Lab 22's checks accept the right answers and explain the usual wrong ones."""

from __future__ import annotations

import pytest

import minidist as md
from minidist.labs import CheckFailed


def _ring(mm, msg, gather):
    t, clock = len(mm), 0.0
    for s in range(t):
        under = (msg[s] if s < t - 1 else 0.0) if gather else (msg[s - 1] if s > 0 else 0.0)
        clock += max(mm[s], under)
    return clock


def test_ring_matmul_time_explains_the_usual_mistakes(capsys):
    md.labs.check_ring_matmul_time(_ring)
    md.labs.check_ring_matmul_time(lambda mm, msg, g: sum(map(max, zip(mm, msg + [0.0] if g else [0.0] + msg))))
    assert capsys.readouterr().out.count("ok: ring_matmul_time") == 2
    with pytest.raises(CheckFailed, match="without overlap"):
        md.labs.check_ring_matmul_time(lambda mm, msg, g: sum(mm) + sum(msg))
    with pytest.raises(CheckFailed, match="the steps are chained"):
        md.labs.check_ring_matmul_time(lambda mm, msg, g: max(sum(mm), sum(msg)))
    with pytest.raises(CheckFailed, match="pair the messages with different products"):
        md.labs.check_ring_matmul_time(lambda mm, msg, g: _ring(mm, msg, True))  # the all-gather's pairing for both
    with pytest.raises(CheckFailed, match="only t - 1 messages"):
        md.labs.check_ring_matmul_time(lambda mm, msg, g: len(mm) * max(mm + msg))
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_ring_matmul_time(lambda mm, msg, g: (_ for _ in ()).throw(NotImplementedError))


def _kv(cfg, tokens, itemsize):
    per_token = cfg.kv_latent if cfg.kv_latent is not None else 2 * cfg.n_kv_heads * cfg.head_dim
    kept = tokens if cfg.window is None else min(tokens, cfg.window)
    return cfg.n_layers * per_token * kept * itemsize


def test_kv_cache_bytes_names_each_missing_factor(capsys):
    md.labs.check_kv_cache_bytes(_kv)
    assert "ok: kv_cache_bytes" in capsys.readouterr().out
    slips = {
        "count the key-value heads": lambda c, t, i: _kv(c, t, i) * (c.n_heads // c.n_kv_heads if c.kv_latent is None
                                                                     else 1),
        "only its latent": lambda c, t, i: c.n_layers * 2 * c.n_kv_heads * c.head_dim * min(t, c.window or t) * i,
        "stops growing": lambda c, t, i: _kv(c, t, i) * t // min(t, c.window or t),
        "every layer keeps its own": lambda c, t, i: _kv(c, t, i) // c.n_layers,
        "count itemsize bytes": lambda c, t, i: _kv(c, t, 1),
        "both the keys and the values": lambda c, t, i: _kv(c, t, i) // (1 if c.kv_latent else 2),
    }
    for hint, wrong in slips.items():
        with pytest.raises(CheckFailed, match=hint):
            md.labs.check_kv_cache_bytes(wrong)


def test_dualpipev_bubble():
    md.labs.check_dualpipev_bubble(lambda p, m: (p - 1) / (6 * m + p - 1))
    with pytest.raises(CheckFailed, match="zero bubble's"):
        md.labs.check_dualpipev_bubble(lambda p, m: (p - 1) / (3 * m + p - 1))
    with pytest.raises(CheckFailed, match="idle share of the whole span"):
        md.labs.check_dualpipev_bubble(lambda p, m: (p - 1) / (6 * m))
