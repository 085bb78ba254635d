"""Pictures: roofline charts, timelines and interactive explorers (matplotlib, ipywidgets)."""

from minidist.viz.explore import explore
from minidist.viz.memory_calculator import memory_breakdown, memory_calculator
from minidist.viz.pipeline import pipeline_explorer, plot_pipeline
from minidist.viz.ring_stepper import ring_stepper
from minidist.viz.roofline import plot_roofline, roofline_explorer

__all__ = ["explore", "memory_breakdown", "memory_calculator", "pipeline_explorer", "plot_pipeline", "plot_roofline",
           "ring_stepper", "roofline_explorer"]
