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


def _on_gpu(whole, piece, message, host, t):
    plain = max((t - 1) * message, host) + whole
    clock = 0.0
    for s in range(t):
        begin = max(clock, (s + 1) * host)
        clock = max(begin + piece, clock + message) if s < t - 1 else begin + piece
    return plain, clock


def test_ring_on_gpu_names_the_host_and_the_ring(capsys):
    md.labs.check_ring_on_gpu(_on_gpu)
    assert "ok: ring_on_gpu" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="cannot start a product before the host"):
        md.labs.check_ring_on_gpu(lambda whole, piece, msg, host, t: _on_gpu(whole, piece, msg, 0.0, t))
    with pytest.raises(CheckFailed, match="in that order"):
        md.labs.check_ring_on_gpu(lambda *a: _on_gpu(*a)[::-1])

    def serial_host(whole, piece, message, host, t):
        clock = 0.0
        for s in range(t):
            begin = clock + host
            clock = max(begin + piece, clock + message) if s < t - 1 else begin + piece
        return _on_gpu(whole, piece, message, host, t)[0], clock

    with pytest.raises(CheckFailed, match="does not wait for the GPU"):
        md.labs.check_ring_on_gpu(serial_host)

    def gather_then_issue(whole, piece, message, host, t):
        return (t - 1) * message + host + whole, _on_gpu(whole, piece, message, host, t)[1]

    with pytest.raises(CheckFailed, match="while the all-gather runs"):
        md.labs.check_ring_on_gpu(gather_then_issue)

    def sent_with_product(whole, piece, message, host, t):
        clock = 0.0
        for s in range(t):
            begin = max(clock, (s + 1) * host)
            clock = max(begin + piece, begin + message) if s < t - 1 else begin + piece
        return _on_gpu(whole, piece, message, host, t)[0], clock

    with pytest.raises(CheckFailed, match="leaves as its step begins"):
        md.labs.check_ring_on_gpu(sent_with_product)


def test_the_ring_on_gpu_reference_is_the_simulators():
    """The check's rule is what the clock of a measured device does with md.parallel.all_gather_matmul."""
    import numpy as np

    from minidist.labs.overlap_checks import _on_gpu as reference

    def run(t, rows, d, decomposed):
        x = md.autograd.shape_only.empty((1, rows, d), np.float16)
        w = md.autograd.shape_only.empty((d, d), np.float16)
        if decomposed:
            md.parallel.all_gather_matmul(x, [w], md.parallel.TPGroup.of(sequence_parallel=True))
        else:
            full = md.autograd.shape_only.empty((t * rows, 1, d), np.float16)
            md.dist.all_gather_into_tensor(full, md.autograd.shape_only.c_order(x.transpose(1, 0, 2)))
            with md.no_grad():
                md.Tensor(full.transpose(1, 0, 2)) @ md.Tensor(w)
        return md.dist.now()

    cluster = md.Cluster("H200-141GB-SXM", kernels="measured")
    km, g = cluster.kernel_model, cluster.gpu

    def product(rows, d):
        return sum(s for _, s in km.kernels("matmul", 2 * rows * d * d, 2 * (2 * rows * d + d * d), "fp16",
                                            g.peak("fp16"), g.hbm_bw, g.peak("fp32"), (1, rows, d, d)))

    t, rows = 4, 512
    for d in (256, 2048, 8192):
        got = [md.launch(run, t, args=(t, rows, d, dec), cluster=cluster, backend="inprocess").values[0]
               for dec in (False, True)]
        want = reference(product(t * rows, d), product(rows, d), cluster.intra_link.time(rows * d * 2),
                         km.host["gemm"], t)
        assert got == pytest.approx(want, rel=1e-12)
