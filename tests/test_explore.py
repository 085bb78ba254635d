"""``md.viz.explore``: a control per keyword (log-scale sliders over powers of two, dropdowns for lists), and the
drawing redone with the new values whenever a control moves; refused combinations are reported, not drawn."""

from __future__ import annotations

import matplotlib

import minidist as md

matplotlib.use("Agg")


def test_controls_follow_the_specs_and_redraw_with_the_new_values():
    seen = []

    def draw(ax, n, p, kind):
        seen.append((n, p, kind))
        if p == 3:
            raise ValueError("p=3 does not split")
        ax.plot([0, 1], [0, n])
        return n * p

    box = md.viz.explore(draw, n=(1, 1024, "log"), p=(1, 4), kind=["ring", "tree"], values={"n": 64})
    n, p, kind = box.children[:3]
    assert list(n.options) == [2**k for k in range(11)] and n.value == 64
    assert (p.min, p.max, kind.value) == (1, 4, "ring") and box.result == 64
    n.value = 128
    assert box.result == 128 and seen[-1] == (128, 1, "ring")
    p.value = 3
    assert box.result is None  # refused: the error is printed under the controls
    kind.value = "tree"
    assert seen[-1] == (128, 3, "tree")
