"""Pictures: roofline charts, timelines and interactive explorers (matplotlib, ipywidgets), and a published run
set beside its simulation and its estimate (``at_scale``)."""

from minidist.viz.at_scale import print_side_by_side, side_by_side
from minidist.viz.explore import explore
from minidist.viz.memory_calculator import memory_breakdown, memory_calculator
from minidist.viz.pipeline import pipeline_explorer, plot_pipeline
from minidist.viz.ring_stepper import ring_stepper
from minidist.viz.roofline import plot_roofline, roofline_explorer

__all__ = ["explore", "memory_breakdown", "memory_calculator", "pipeline_explorer", "plot_pipeline", "plot_roofline",
           "print_side_by_side", "ring_stepper", "roofline_explorer", "side_by_side"]
