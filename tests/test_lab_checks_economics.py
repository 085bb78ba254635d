"""Lab 03's sandbox-MFU check names the usual slips."""

from __future__ import annotations

import pytest

import minidist as md
from minidist.labs.check import CheckFailed

ARGS = dict(n_params=421_376, tokens=512, seconds=39e-6, peak=67e12)
MFU = 6 * 421_376 * 512 / (39e-6 * 67e12)


def test_sandbox_mfu_accepts_the_fraction(capsys):
    md.labs.check_sandbox_mfu(MFU, **ARGS)
    assert "ok: sandbox MFU" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, match", [(100 * MFU, "not in percent"), (MFU / 3, "backward pass"),
                                          (MFU / 2, "achieved model FLOP/s over the peak")])
def test_sandbox_mfu_rejects_with_a_hint(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        md.labs.check_sandbox_mfu(wrong, **ARGS)


def test_cheapest_fleet_accepts_the_reference_and_names_the_missing_all_reduce_and_deadline():
    from functools import partial

    from minidist.labs.economics_checks import _fleet

    md.labs.check_cheapest_fleet(_fleet)
    with pytest.raises(CheckFailed, match="add the gradient all-reduce"):
        md.labs.check_cheapest_fleet(partial(_fleet, comm=False))
    with pytest.raises(CheckFailed, match="finishes too late"):
        md.labs.check_cheapest_fleet(partial(_fleet, deadline=False))


@pytest.fixture(scope="module")
def measured_step():
    """Lab 03's data-parallel step on the measured device: 4 ranks of a 2-layer GPT, shape as in the notebook."""
    import numpy as np

    cfg = md.GPTConfig(vocab_size=64, seq_len=32, d_model=64, n_layers=2, n_heads=4)

    def step():
        model = md.GPT(cfg, seed=0)
        x = np.random.default_rng(md.dist.get_rank()).integers(0, 64, (4, 32))
        t0 = md.dist.now()
        _, loss = model(x, x)
        loss.backward()
        return md.dist.now() - t0

    res = md.launch(step, world_size=2, cluster=md.Cluster.dgx_h100(nodes=1, kernels="measured"))
    busy = sum(e.end - e.start for e in res.trace.filter(rank=0, stream="compute"))
    n = md.GPT(cfg).num_parameters()
    return res, n, res[0], busy


def _wrap(res, seconds):
    """``res`` with ``res[0][0] == seconds``, as the notebook's dp_step returns (compute, comm, bytes)."""
    class R:
        trace = res.trace

        def __getitem__(self, i):
            return (seconds, 0.0, 0)
    return R()


def test_measured_gap_accepts_the_mfu_and_the_wait_share(measured_step, capsys):
    res, n, seconds, busy = measured_step
    assert busy < seconds  # a tiny model on the measured device waits for the host
    mfu = 6 * n * 128 / (seconds * 67e12)
    md.labs.check_measured_gap(mfu, 1 - busy / seconds, result=_wrap(res, seconds), n_params=n, tokens=128,
                               peak=67e12)
    assert "ok: measured MFU" in capsys.readouterr().out


def test_measured_gap_names_the_usual_slips(measured_step):
    res, n, seconds, busy = measured_step
    run = _wrap(res, seconds)
    mfu = 6 * n * 128 / (seconds * 67e12)
    kw = dict(result=run, n_params=n, tokens=128, peak=67e12)
    with pytest.raises(CheckFailed, match="not by its busy time alone"):
        md.labs.check_measured_gap(6 * n * 128 / (busy * 67e12), 1 - busy / seconds, **kw)
    with pytest.raises(CheckFailed, match="not in percent"):
        md.labs.check_measured_gap(100 * mfu, 1 - busy / seconds, **kw)
    with pytest.raises(CheckFailed, match="the share in which the GPU works"):
        md.labs.check_measured_gap(mfu, busy / seconds, **kw)
    with pytest.raises(CheckFailed, match="1 - busy / window"):
        md.labs.check_measured_gap(mfu, 0.0, **kw)
