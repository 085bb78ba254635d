"""Pictures: roofline charts, timelines and interactive explorers (matplotlib, ipywidgets)."""

from minidist.viz.pipeline import pipeline_explorer, plot_pipeline
from minidist.viz.roofline import plot_roofline, roofline_explorer

__all__ = ["pipeline_explorer", "plot_pipeline", "plot_roofline", "roofline_explorer"]
