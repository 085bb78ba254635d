"""The pictures draw what they claim (checked on the Agg backend, no screen needed)."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from minidist.viz import plot_roofline, roofline_explorer  # noqa: E402


def test_roofline_lines_meet_at_the_ridge_point():
    ax = plot_roofline(1e15, 2e12, 5e10, [("op", 10.0, 1e13)])
    mem, net = ax.get_lines()[0], ax.get_lines()[1]
    x, y = mem.get_data()
    i = np.searchsorted(x, 1e15 / 2e12)  # memory ridge at 500 FLOP/B
    assert y[i - 1] < 1e15 and y[i + 1] == pytest.approx(1e15)
    xn, yn = net.get_data()
    assert np.allclose(yn, np.minimum(1e15, 5e10 * xn))


def test_roofline_rejects_nonpositive_bandwidth():
    with pytest.raises(ValueError, match="positive"):
        plot_roofline(1e15, 0.0)


def test_explorer_builds_its_widgets():
    box = roofline_explorer()
    assert len(box.children) == 3
