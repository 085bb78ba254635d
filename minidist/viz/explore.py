"""One small explorer for every lab: controls around a drawing function, redrawn when any control moves.

``explore(draw, n=(1, 1 << 30, "log"), p=(2, 16), schedule=["ring", "tree"])`` builds a slider per numeric range (a
log-scale one over powers of two when the range ends with ``"log"``: message sizes and bandwidths span orders of
magnitude) and a dropdown per list, and calls ``draw(ax, n=..., p=..., schedule=...)`` on a fresh figure each time.
Whatever ``draw`` returns is kept as ``box.result`` (the tests read it); what it prints appears under the plot.
"""

from __future__ import annotations

from collections.abc import Callable


def _control(name: str, spec, value):
    import ipywidgets as w

    style, layout = {"description_width": "120px"}, w.Layout(width="380px")
    if isinstance(spec, list):
        return w.Dropdown(options=spec, value=spec[0] if value is None else value, description=name, style=style,
                          layout=layout)
    lo, hi, *scale = spec
    if scale == ["log"]:
        options, x = [], lo
        while x <= hi:
            options.append(x)
            x *= 2
        pick = value if value in options else options[len(options) // 2]
        return w.SelectionSlider(options=options, value=pick, description=name, style=style, layout=layout)
    if isinstance(lo, float) or isinstance(hi, float):
        return w.FloatSlider(value=lo if value is None else value, min=lo, max=hi, step=(hi - lo) / 100,
                             description=name, style=style, layout=layout)
    return w.IntSlider(value=lo if value is None else value, min=lo, max=hi, description=name, style=style,
                       layout=layout)


def explore(draw: Callable, figsize: tuple[float, float] = (7, 3.2), values: dict | None = None, **controls):
    """Controls for each keyword of ``draw(ax, **values)`` and a plot redrawn whenever one moves (see module)."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    values = values or {}
    made = {name: _control(name, spec, values.get(name)) for name, spec in controls.items()}
    out = w.Output()
    box = w.VBox([*made.values(), out])
    box.result = None

    def redraw(*_):
        with out:
            out.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=figsize, dpi=80, layout="constrained")
            try:
                box.result = draw(ax, **{name: c.value for name, c in made.items()})
            except ValueError as err:  # a combination the model refuses: say why instead of drawing
                box.result = None
                plt.close(fig)
                print(err)
                return
            plt.show()

    for c in made.values():
        c.observe(redraw, names="value")
    redraw()
    return box
