"""The extended roofline as a picture (book chapter 2, lab 01).

Attainable FLOP/s is the minimum of three ceilings: the compute peak ``F``, memory bandwidth times
arithmetic intensity, and network bandwidth times network intensity. On log-log axes each
bandwidth ceiling is a line of slope one that meets the flat peak at its ridge point ``F / BW``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from minidist.hardware import specs


def _attainable(peak: float, bw: float, intensity: np.ndarray) -> np.ndarray:
    return np.minimum(peak, bw * intensity)


def plot_roofline(peak_flops: float, mem_bw: float, net_bw: float | None = None,
                  points: Iterable[Sequence] = (), ax=None, title: str | None = None,
                  intensity_range: tuple[float, float] = (1e-1, 1e6)):
    """Draw the memory (and optionally network) roofline; return the matplotlib Axes.

    ``points`` are ``(label, intensity, achieved_flops)`` or ``(label, intensity, achieved_flops, kind)``
    with kind ``"mem"`` or ``"net"``: measured operations placed under the ceiling they are bound by.
    """
    import matplotlib.pyplot as plt

    if peak_flops <= 0 or mem_bw <= 0 or (net_bw is not None and net_bw <= 0):
        raise ValueError("plot_roofline: peak_flops, mem_bw and net_bw must be positive")
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 4.0), dpi=80, layout="constrained")
    xs = np.logspace(np.log10(intensity_range[0]), np.log10(intensity_range[1]), 400)
    ax.loglog(xs, _attainable(peak_flops, mem_bw, xs), color="C0", lw=2,
              label=f"memory: {mem_bw / 1e12:.2f} TB/s x I  (ridge {peak_flops / mem_bw:,.0f} FLOP/B)")
    if net_bw is not None:
        ax.loglog(xs, _attainable(peak_flops, net_bw, xs), color="C3", lw=2, ls="--",
                  label=f"network: {net_bw / 1e9:.0f} GB/s x I  (ridge {peak_flops / net_bw:,.0f} FLOP/B)")
    ax.axhline(peak_flops, color="k", lw=0.8, ls=":", label=f"peak {peak_flops / 1e12:.0f} TFLOP/s")
    for p in points:
        label, intensity, achieved = p[0], p[1], p[2]
        kind = p[3] if len(p) > 3 else "mem"
        ax.plot([intensity], [achieved], "o", color="C3" if kind == "net" else "C0", ms=6)
        ax.annotate(label, (intensity, achieved), textcoords="offset points", xytext=(5, -12), fontsize=8)
    ax.set_xlabel("intensity (FLOP per byte)")
    ax.set_ylabel("attainable FLOP/s")
    ax.set_title(title or "the extended roofline")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="major", alpha=0.3)
    return ax


def roofline_explorer(gpu: str = "H100-80GB-SXM", link: str = "IB-NDR400", dtype: str = "bf16"):
    """An ipywidgets explorer: pick a GPU and a network link, move a data-parallel job along the roofline.

    The job is data parallelism on ``P`` GPUs with ``tokens`` tokens per step: its compute is
    ``6 * params * tokens / P`` FLOP per GPU and it all-reduces ``2 * params`` bytes of bf16 gradients,
    so its network intensity is ``3 * tokens / (P * 2)`` FLOP per byte (chapter 2's I_DP with 2-byte grads).
    """
    import ipywidgets as w
    import matplotlib.pyplot as plt

    gpus = [g for g in specs.GPUS if dtype in specs.GPUS[g].peak_flops]
    gpu_w = w.Dropdown(options=gpus, value=gpu, description="GPU")
    link_w = w.Dropdown(options=list(specs.LINKS), value=link, description="network")
    tokens_w = w.FloatLogSlider(value=1e6, base=10, min=4, max=8, description="tokens/step")
    p_w = w.IntSlider(value=64, min=2, max=4096, description="GPUs")
    out = w.Output()

    def redraw(*_):
        g, l = specs.gpu(gpu_w.value), specs.link(link_w.value)
        peak = g.peak(dtype)
        i_net = 3 * tokens_w.value / (2 * p_w.value)
        attained = min(peak, l.beta * i_net)
        with out:
            out.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=80, layout="constrained")
            plot_roofline(peak, g.hbm_bw, l.beta, [("DP job", i_net, attained, "net")], ax=ax,
                          title=f"{g.name} + {l.name}: DP job is {'network' if attained < peak else 'compute'}-bound")
            plt.show()

    for widget in (gpu_w, link_w, tokens_w, p_w):
        widget.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox([gpu_w, link_w]), w.HBox([tokens_w, p_w]), out])
