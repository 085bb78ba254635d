"""Profiling a simulated run from its trace (book ch32-33, lab 23): where each step's time went, how much
communication hid behind compute, which rank straggles, MFU and HFU, each collective's bandwidth in nccl-tests'
columns, the alpha-beta constants of a link; mystery runs with one fault drawn from a seed, to investigate; and the
measured device's kernel model checked against the kernels and training steps it was measured on."""

from minidist.profiling.alpha_beta import fit_alpha_beta, link_samples
from minidist.profiling.bandwidth import bus_factor, collective_table, format_table
from minidist.profiling.budget import Budget, axis_of, compute_category, run_budget, step_budget
from minidist.profiling.investigate import Report, investigate
from minidist.profiling.links import link_bandwidths, slow_links
from minidist.profiling.measured_device import kernel_rows, step_rows, validate_device
from minidist.profiling.mystery import CAUSES, REMEDIES, Mystery, mystery_run
from minidist.profiling.stragglers import compute_time_per_rank, robust_z, stragglers
from minidist.profiling.utilization import step_flops, utilization

__all__ = ["Budget", "axis_of", "bus_factor", "collective_table", "compute_category", "compute_time_per_rank",
           "fit_alpha_beta", "format_table", "link_samples", "robust_z", "run_budget", "step_budget", "step_flops",
           "stragglers", "utilization", "link_bandwidths", "slow_links", "Report",
           "investigate", "CAUSES", "REMEDIES", "Mystery", "mystery_run", "kernel_rows", "step_rows",
           "validate_device"]
