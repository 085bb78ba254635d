"""Profiling a simulated run from its trace (book ch32-33, lab 23): where each step's time went, how much
communication hid behind compute, which rank straggles, and the alpha-beta constants of a link."""

from minidist.profiling.alpha_beta import fit_alpha_beta, link_samples
from minidist.profiling.budget import Budget, compute_category, run_budget, step_budget
from minidist.profiling.stragglers import compute_time_per_rank, robust_z, stragglers

__all__ = ["Budget", "compute_category", "compute_time_per_rank", "fit_alpha_beta", "link_samples", "robust_z",
           "run_budget", "step_budget", "stragglers"]
