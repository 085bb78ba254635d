"""Checks the lab notebooks call on the learner's code (``md.labs.check_*``), and the lab builder.

Each check runs the learner's function against a reference and raises :class:`CheckFailed` with what
went wrong and a hint; on success it prints one line.
"""

from minidist.labs.alpha_beta_checks import (
    check_chunked_time,
    check_crossover,
    check_fit_alpha_beta,
    check_real_fit,
    check_relay_time,
)
from minidist.labs.capstone_checks import (
    Design,
    check_busy_by_op,
    check_checkpoint_plan,
    check_days_and_cost,
    check_design,
    check_mfu_of,
)
from minidist.labs.case_checks import check_implied_step, check_receptive_field, check_serving_memory
from minidist.labs.check import CheckFailed
from minidist.labs.collective_algebra_checks import check_all_reduce_rs_ag, check_fp_prediction, check_identity
from minidist.labs.compression_checks import (
    check_powersgd_step,
    check_stochastic_round,
    check_time_to_target,
    check_topk_feedback,
)
from minidist.labs.context_checks import check_cp_volumes, check_ring_attention, check_softmax_merge
from minidist.labs.data_parallel_checks import (
    check_bucketed_time,
    check_dp_gradient,
    check_dp_min_tokens,
    check_exposed_comm,
)
from minidist.labs.economics_checks import (
    check_approx_params,
    check_cheapest_fleet,
    check_measured_gap,
    check_memory_estimates,
    check_run_estimate,
    check_sandbox_mfu,
)
from minidist.labs.expert_checks import (
    check_aux_loss,
    check_capacity_keep,
    check_dispatch_splits,
    check_top_k_routing,
)
from minidist.labs.local_sgd_checks import check_expected_slowest, check_local_time_to_target, check_outer_round
from minidist.labs.mesh_5d_checks import check_axes_between, check_place_axes, check_state_5d
from minidist.labs.mesh_checks import (
    check_axis_bytes,
    check_axis_of,
    check_law_terms,
    check_mesh_groups,
    check_plan_3d,
    check_redistribute,
)
from minidist.labs.notebook import install as _install_notebook_errors
from minidist.labs.overlap_checks import (
    check_dualpipev_bubble,
    check_kv_cache_bytes,
    check_ring_matmul_time,
    check_ring_on_gpu,
)
from minidist.labs.pipeline_checks import check_1f1b_actions, check_bubble, check_walk_schedule
from minidist.labs.precision_checks import (
    check_loss_scale_update,
    check_max_finite,
    check_measured_step_time,
    check_round_to,
    check_step_time,
)
from minidist.labs.profiling_checks import (
    check_bus_bandwidth,
    check_diagnosis,
    check_overlap,
    check_overlap_fraction,
    check_robust_z,
)
from minidist.labs.recompute_checks import (
    check_best_interval,
    check_checkpointed_bytes,
    check_exact_peak,
    check_overlap_tokens,
    check_plan_recompute,
)
from minidist.labs.resilience_checks import (
    check_checkpoint_interval,
    check_expected_completion,
    check_expected_overhead,
    check_reshard_plan,
)
from minidist.labs.ring_checks import (
    check_collective_times,
    check_halving_doubling_all_reduce,
    check_ring_all_reduce,
    check_ring_tree_crossover,
)
from minidist.labs.roofline_checks import (
    check_accumulation_steps,
    check_attainable,
    check_dp_network_intensity,
    check_half_roofline_work,
    check_kernel_time,
    check_matmul_intensity,
    check_tiled_intensity,
)
from minidist.labs.sandbox_checks import check_direct_all_reduce, check_send_time, check_shift_right
from minidist.labs.scaling_checks import check_compute_optimal, check_noise_scale, check_power_law_fit
from minidist.labs.search_checks import check_dp_exposed, check_layouts, check_search, check_state_bytes
from minidist.labs.tensor_checks import (
    check_column_parallel,
    check_megatron_mlp,
    check_row_parallel,
    check_sequence_parallel_mlp,
    check_tp_layer_bytes,
    check_tp_layer_time,
)
from minidist.labs.topology_checks import (
    check_flows_per_nic,
    check_hierarchical_all_reduce,
    check_two_level_times,
)
from minidist.labs.zero_checks import (
    check_min_gpus,
    check_model_state_bytes,
    check_zero3_forward,
    check_zero_comm_bytes,
)

_install_notebook_errors()  # in a notebook: check messages without the check's source, one line per stub

__all__ = ["CheckFailed", "Design", *sorted(name for name in dir() if name.startswith("check_"))]
