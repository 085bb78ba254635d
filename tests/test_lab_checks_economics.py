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
