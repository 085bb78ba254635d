"""Pipeline parallelism: consecutive layers on consecutive devices, micro-batches flowing between them
(chapter 16).

Property: separability. The model is a composition ``f_L o ... o f_1``, so a stage needs only the previous
stage's output (forward) and the next stage's input gradient (backward) of a micro-batch, and a linear layer's
backward splits into an input gradient someone waits for and a weight gradient no one does. ``schedules``
(schedules as data: GPipe, 1F1B, interleaved, ZB-H1), ``schedule_walk`` (the deadlock checker and simulator),
``dualpipe`` (DualPipeV, the pipeline folded into a V), ``split_backward`` (input- and weight-gradient passes
for zero bubble), ``stages`` (where to cut the model), ``chunk`` (one virtual stage's forward) and
``executor`` (the executor that runs any schedule).

Below ``tensor``: a tensor-parallel linear defers its weight gradient with ``split_backward``.

Read by lab 10 (pipeline parallelism) and lab 22 (DualPipeV); composed by ``md.parallel.train`` in labs 15-16.
"""

from minidist.parallel.pipeline import dualpipe, schedules
from minidist.parallel.pipeline.dualpipe import dualpipev
from minidist.parallel.pipeline.executor import PipelineExecutor, measure_schedule
from minidist.parallel.pipeline.schedule_walk import check_schedule, simulate
from minidist.parallel.pipeline.schedules import Action, Schedule, ScheduleError, bubble_fraction, make_schedule
from minidist.parallel.pipeline.split_backward import WeightGradStore, weight_grads
from minidist.parallel.pipeline.stages import partition

__all__ = ["Action", "PipelineExecutor", "Schedule", "ScheduleError", "WeightGradStore", "bubble_fraction",
           "check_schedule", "dualpipe", "dualpipev", "make_schedule", "measure_schedule", "partition",
           "schedules", "simulate", "weight_grads"]
