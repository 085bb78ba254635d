"""A memory calculator: what one GPU holds at the peak of a training step, by category (labs 13 and 15).

The numbers are ``md.estimate.predict_train``'s, which follows the simulator's memory ledger op by op, so for
every layout it models they are the ledger's peak exactly (``tests/test_memory_calculator.py`` checks five small
configurations against ``md.parallel.train``), and for large models they are what the same ledger would say.
"""

from __future__ import annotations

from minidist.estimate import predict_train

CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers")


def memory_breakdown(model_config, parallel, global_batch: int, dtype: str = "float64") -> dict[str, float]:
    """Bytes per category held by the fullest GPU at its peak, and their ``total``."""
    return dict(predict_train(model_config, parallel, global_batch, dtype=dtype).memory)


def memory_calculator(d_model: int = 1024, n_layers: int = 24, seq_len: int = 1024, global_batch: int = 32):
    """ipywidgets: a GPT's width, depth and context (log-scale sliders), the batch, tp / pp / dp, the ZeRO stage
    and recomputation; the bar shows what the fullest GPU holds at its peak against an 80 GB H100."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    from minidist.nn import GPTConfig
    from minidist.parallel import ParallelConfig

    style = {"description_width": "110px"}
    layout = w.Layout(width="340px")
    width = w.SelectionSlider(options=[2 ** k for k in range(6, 14)], value=d_model, description="d_model",
                              style=style, layout=layout)
    depth = w.IntSlider(value=n_layers, min=2, max=96, step=2, description="layers", style=style, layout=layout)
    context = w.SelectionSlider(options=[2 ** k for k in range(7, 15)], value=seq_len, description="sequence",
                                style=style, layout=layout)
    batch = w.SelectionSlider(options=[2 ** k for k in range(0, 11)], value=global_batch,
                              description="global batch", style=style, layout=layout)
    tp = w.Dropdown(options=[1, 2, 4, 8], value=1, description="tp", style=style, layout=layout)
    pp = w.Dropdown(options=[1, 2, 4, 8], value=1, description="pp", style=style, layout=layout)
    dp = w.Dropdown(options=[1, 2, 4, 8, 16, 32], value=8, description="dp", style=style, layout=layout)
    zero = w.Dropdown(options=[0, 1, 2, 3], value=1, description="ZeRO stage", style=style, layout=layout)
    recompute = w.Dropdown(options=[("none", None), ("full", "full")], value=None, description="recompute",
                           style=style, layout=layout)
    out = w.Output()
    box = w.VBox([w.HBox([w.VBox([width, depth, context, batch]), w.VBox([tp, pp, dp, zero, recompute])]), out])
    box.breakdown = {}  # the numbers drawn last (for tests and for reading them off)

    def redraw(*_):
        with out:
            out.clear_output(wait=True)
            try:
                heads = max(1, width.value // 64)
                cfg = GPTConfig(vocab_size=32000, seq_len=context.value, d_model=width.value, n_layers=depth.value,
                                n_heads=heads)
                pc = ParallelConfig(tp=tp.value, pp=pp.value, dp=dp.value, zero_stage=zero.value,
                                    recompute=recompute.value, microbatches=max(1, 2 * pp.value) if pp.value > 1 else 1)
                mem = memory_breakdown(cfg, pc, batch.value, dtype="float32")
            except ValueError as err:
                box.breakdown = {}
                print(err)
                return
            box.breakdown = mem
            fig, ax = plt.subplots(figsize=(7, 1.8), dpi=80, layout="constrained")
            left = 0.0
            for cat in CATEGORIES:
                gb = mem.get(cat, 0.0) / 1e9
                ax.barh([0], [gb], left=left, label=f"{cat} {gb:.1f} GB")
                left += gb
            ax.axvline(80, color="k", ls=":", lw=1)
            ax.set_yticks([])
            ax.set_xlabel("GB per GPU at the peak (fp32 training; dotted: an 80 GB H100)")
            ax.set_title(f"{mem['total'] / 1e9:.1f} GB on the fullest of {tp.value * pp.value * dp.value} GPUs",
                         fontsize=10)
            ax.legend(fontsize=7, ncols=5, loc="upper center", bbox_to_anchor=(0.5, -0.45), frameon=False)
            plt.show()

    for control in (width, depth, context, batch, tp, pp, dp, zero, recompute):
        control.observe(redraw, names="value")
    redraw()
    return box
