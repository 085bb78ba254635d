"""Pictures: roofline charts, timelines and interactive explorers (matplotlib, ipywidgets)."""

from minidist.viz.roofline import plot_roofline, roofline_explorer

__all__ = ["plot_roofline", "roofline_explorer"]
