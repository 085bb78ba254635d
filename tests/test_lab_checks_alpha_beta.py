"""Lab 02 checks accept the right answers and reject the typical wrong ones with the intended hint."""

import numpy as np
import pytest

import minidist as md
from minidist.labs import CheckFailed
from minidist.labs.alpha_beta_checks import reference_fit


def fit_relative(n, t):
    (a, inv_b), *_ = np.linalg.lstsq(np.stack([1 / t, n / t], axis=1), np.ones_like(t), rcond=None)
    return a, 1 / inv_b


def fit_polyfit_weighted(n, t):
    slope, intercept = np.polyfit(n, t, 1, w=1 / t)
    return intercept, 1 / slope


def fit_ordinary(n, t):
    slope, intercept = np.polyfit(n, t, 1)
    return intercept, 1 / slope


def test_fit_accepts_relative_least_squares_in_two_spellings(capsys):
    md.labs.check_fit_alpha_beta(fit_relative)
    md.labs.check_fit_alpha_beta(fit_polyfit_weighted)
    assert capsys.readouterr().out.count("ok: fit_alpha_beta") == 2


def test_fit_rejects_typical_mistakes():
    with pytest.raises(CheckFailed, match="ordinary least squares"):
        md.labs.check_fit_alpha_beta(fit_ordinary)
    with pytest.raises(CheckFailed, match="invert it"):
        md.labs.check_fit_alpha_beta(lambda n, t: (fit_relative(n, t)[0], 1 / fit_relative(n, t)[1]))
    with pytest.raises(CheckFailed, match="swapped"):
        md.labs.check_fit_alpha_beta(lambda n, t: (1 / fit_relative(n, t)[1], fit_relative(n, t)[0]))
    with pytest.raises(CheckFailed, match="return alpha, beta"):
        md.labs.check_fit_alpha_beta(lambda n, t: None)
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_fit_alpha_beta(lambda n, t: (_ for _ in ()).throw(NotImplementedError))


def test_ordinary_fit_really_is_worse_on_the_noisy_case():
    """The noisy case is there for a reason: OLS misses alpha by far more than the relative fit."""
    n = np.array([8, 1024, 65536, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20], float)
    rng = np.random.default_rng(7)
    t = (2e-6 + n / 50e9) * (1 + 0.03 * rng.standard_normal(n.size))
    rel_err_ols = abs(fit_ordinary(n, t)[0] - 2e-6) / 2e-6
    rel_err_rel = abs(reference_fit(n, t)[0] - 2e-6) / 2e-6
    assert rel_err_rel < 0.05 and rel_err_ols > 0.5


def test_real_fit_plausibility(capsys):
    n = np.array([8, 1024, 65536, 1 << 20, 4 << 20], float)
    t = (30e-6 + n / 5e9) * np.array([1.05, 0.97, 1.02, 0.99, 1.01])
    md.labs.check_real_fit(*fit_relative(n, t), n, t)
    assert "ok: a plausible fit" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="positive"):
        md.labs.check_real_fit(-1e-6, 5e9, n, t)
    with pytest.raises(CheckFailed, match="microseconds"):
        md.labs.check_real_fit(30.0, 5e9, n, t)
    with pytest.raises(CheckFailed, match="slope"):
        md.labs.check_real_fit(30e-6, 2e-10, n, t)
    with pytest.raises(CheckFailed, match="residual"):
        md.labs.check_real_fit(30e-6, 5e8, n, t)


def test_real_fit_on_timings_no_line_fits_is_judged_against_the_best_fit(capsys):
    """A loaded CI machine gave timings whose best relative fit missed by 40%: the right fit passes, a
    beta ten times off still fails."""
    n = np.array([8, 256, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20], float)
    t = (10e-6 + n / 13e9) * np.array([1.6, 0.6, 1.5, 0.55, 1.7, 0.6, 1.45, 0.6])
    best = reference_fit(n, t)
    assert np.median(np.abs(best[0] + n / best[1] - t) / t) > 0.35
    md.labs.check_real_fit(*best, n, t)
    assert "noisy" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="residual"):
        md.labs.check_real_fit(best[0], best[1] / 10, n, t)


def test_crossover_and_chunked_time():
    md.labs.check_crossover(lambda a, b: a * b)
    with pytest.raises(CheckFailed, match="solve alpha = n / beta"):
        md.labs.check_crossover(lambda a, b: a / b)
    md.labs.check_chunked_time(lambda n, k, a, b: k * a + n / b)
    with pytest.raises(CheckFailed, match="n/k bytes"):
        md.labs.check_chunked_time(lambda n, k, a, b: k * (a + n / b))
    with pytest.raises(CheckFailed, match="its own latency"):
        md.labs.check_chunked_time(lambda n, k, a, b: a + n / b)


def test_relay_time_check_accepts_the_pipeline_and_names_the_whole_chain_in_series():
    from functools import partial

    from minidist.labs.alpha_beta_checks import _relay

    md.labs.check_relay_time(_relay)
    with pytest.raises(CheckFailed, match="while piece j crosses"):
        md.labs.check_relay_time(partial(_relay, pipelined=False))
    with pytest.raises(CheckFailed, match="the message sent whole"):
        md.labs.check_relay_time(lambda n, k, links: _relay(n, 1, links))
    # identical pieces in a chain: one crossing of every link plus k - 1 of the slowest is the same answer
    md.labs.check_relay_time(lambda n, k, links: sum(a + n / k / b for a, b in links)
                             + (k - 1) * max(a + n / k / b for a, b in links))
