"""md.estimate: the book's closed-form models as pure functions, named configs, and a layout planner.

No processes, no state: the engineer's calculator and the labs' formula side. SI units throughout
(bytes, seconds, FLOPs, FLOP/s, bytes/s; alpha in seconds, beta in bytes/s per direction).
Modules, one per part of the book: roofline, comm, flops, memory, pipeline, strategies, scaling,
reliability, economics, frontier; models and clusters (named configs); perf (the step-time model),
calibration (fits its two constants, kept in calibrated, on Megatron 2021), planner and search; gpt_ops, streams,
sharded_step and predict (``predict_train``: a run of ``md.parallel.train`` predicted op by op, equal to the simulator).
See README.md beside this file.
"""

from minidist.estimate.calibration import CALIBRATED, fit_efficiency, predict_megatron_tflops
from minidist.estimate.clusters import CLUSTERS, ClusterSpec, cluster
from minidist.estimate.comm import (
    ALGORITHMS,
    OPS,
    algorithm_bandwidth,
    bucketed_all_reduce_time,
    bus_bandwidth,
    collective_bytes,
    collective_time,
    crossover_bytes,
    hierarchical_all_reduce_time,
    hierarchical_inter_node_bytes,
    overlapped_time,
    ring_tree_crossover_bytes,
)
from minidist.estimate.device_efficiency import device_efficiency
from minidist.estimate.economics import (
    break_even_hours,
    cost_per_token,
    gpu_hours,
    gpus_for_budget,
    required_mfu,
    spot_effective_rate,
    training_cost,
)
from minidist.estimate.flops import (
    megatron_flops,
    mfu,
    moe_params,
    padded_heads,
    step_time,
    tokens_per_second,
    training_flops,
    training_time,
    transformer_params,
)
from minidist.estimate.frontier import (
    is_update_swamped,
    max_loss_scale,
    min_loss_scale,
    powersgd_compression_ratio,
    quantization_compression_ratio,
    topk_compression_ratio,
)
from minidist.estimate.memory import (
    activation_bytes,
    attention_scores_bytes,
    checkpointed_activation_bytes,
    kv_cache_bytes,
    mla_kv_cache_bytes,
    model_state_breakdown,
    model_state_bytes,
    offload_gpu_bytes,
    offload_min_tokens,
    optimal_checkpoint_interval,
    prefetch_depth,
    recompute_overhead,
    zero_memory_reduction,
)
from minidist.estimate.models import MODELS, ModelConfig, model
from minidist.estimate.perf import Efficiency, Estimate, Layout, estimate_layout
from minidist.estimate.pipeline import (
    inflight_microbatches,
    pipeline_bubble,
    pipeline_efficiency,
    stage_balance_efficiency,
    stage_orders,
)
from minidist.estimate.planner import format_table, plan
from minidist.estimate.predict import Prediction, predict_train
from minidist.estimate.reliability import (
    checkpoint_blocking_time,
    checkpoint_overhead,
    expected_completion_without_checkpoints,
    failure_overhead,
    system_mtbf,
    young_daly_interval,
)
from minidist.estimate.roofline import (
    arithmetic_intensity,
    attainable_flops,
    dp_compute_comm_ratio,
    dp_network_intensity,
    ridge_point,
    roofline_time,
)
from minidist.estimate.scaling import (
    CHINCHILLA,
    batch_scaling_efficiency,
    chinchilla_loss,
    chinchilla_optimal,
    critical_batch_size,
    emergence_loss_gap,
    emergence_probability,
    scaled_learning_rate,
    steps_to_target,
)
from minidist.estimate.search import (
    RULES,
    SearchResult,
    advise,
    check_rules,
    evolutionary_search,
    grid_search,
    hierarchical_search,
)
from minidist.estimate.strategies import (
    cp_ring_bytes_per_layer,
    dp_all_reduce_bytes,
    dropped_tokens,
    ep_all_to_all_bytes,
    expert_capacity,
    layernorm_stats_bytes,
    pp_activation_bytes,
    pp_comm_bytes_total,
    tp_all_reduces_per_layer,
    tp_comm_bytes,
    ulysses_bytes_per_layer,
    zero3_comm_time,
    zero_comm_bytes,
)

__all__ = [
    "activation_bytes", "algorithm_bandwidth", "ALGORITHMS", "arithmetic_intensity", "attainable_flops",
    "attention_scores_bytes", "batch_scaling_efficiency", "break_even_hours", "bucketed_all_reduce_time",
    "bus_bandwidth", "CALIBRATED", "device_efficiency", "checkpoint_blocking_time", "checkpoint_overhead",
    "checkpointed_activation_bytes", "CHINCHILLA", "chinchilla_loss", "chinchilla_optimal", "cluster", "CLUSTERS",
    "ClusterSpec", "collective_bytes", "collective_time", "cost_per_token", "cp_ring_bytes_per_layer",
    "critical_batch_size", "crossover_bytes", "dp_all_reduce_bytes", "dp_compute_comm_ratio",
    "dp_network_intensity", "dropped_tokens", "Efficiency", "emergence_loss_gap", "emergence_probability",
    "ep_all_to_all_bytes", "Estimate", "estimate_layout", "expected_completion_without_checkpoints",
    "expert_capacity", "failure_overhead", "fit_efficiency", "format_table", "gpu_hours", "gpus_for_budget",
    "hierarchical_all_reduce_time", "hierarchical_inter_node_bytes", "inflight_microbatches", "is_update_swamped",
    "kv_cache_bytes", "layernorm_stats_bytes", "Layout", "max_loss_scale", "megatron_flops", "mfu",
    "min_loss_scale", "mla_kv_cache_bytes", "model", "model_state_breakdown", "model_state_bytes", "ModelConfig",
    "MODELS", "moe_params", "offload_gpu_bytes", "offload_min_tokens", "OPS", "optimal_checkpoint_interval",
    "overlapped_time", "padded_heads", "pipeline_bubble", "pipeline_efficiency", "plan",
    "powersgd_compression_ratio", "pp_activation_bytes", "pp_comm_bytes_total", "predict_megatron_tflops",
    "predict_train", "Prediction", "stage_orders", "grid_search", "hierarchical_search", "evolutionary_search",
    "advise", "check_rules", "RULES", "SearchResult",
    "prefetch_depth", "quantization_compression_ratio", "recompute_overhead", "required_mfu", "ridge_point",
    "ring_tree_crossover_bytes", "roofline_time", "scaled_learning_rate", "spot_effective_rate",
    "stage_balance_efficiency", "step_time", "steps_to_target", "system_mtbf", "tokens_per_second",
    "topk_compression_ratio", "tp_all_reduces_per_layer", "tp_comm_bytes", "training_cost", "training_flops",
    "training_time", "transformer_params", "ulysses_bytes_per_layer", "young_daly_interval", "zero3_comm_time",
    "zero_comm_bytes", "zero_memory_reduction"
]


def _refuse_non_finite() -> None:
    import inspect

    from minidist.estimate._check import finite_numbers

    for name in __all__:
        fn = globals()[name]
        if inspect.isfunction(fn):
            globals()[name] = finite_numbers(fn)


_refuse_non_finite()
