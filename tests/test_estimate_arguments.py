"""Every public md.estimate function refuses NaN and infinite numbers, naming itself and the argument.

Each function is called once with valid arguments (the table below), then with each numeric argument in
turn replaced by nan, inf and -inf: the call must raise ValueError naming that argument, never return
NaN or raise ZeroDivisionError / OverflowError.
"""

from __future__ import annotations

import inspect
import math
import numbers

import pytest

import minidist.estimate as E
from minidist.hardware import ROOFLINE, gpu

# valid arguments where the defaults of the heuristic below do not make a valid call
EXAMPLES: dict[str, dict] = {
    "activation_bytes": dict(seq=128, batch=2, hidden=64, heads=4, layers=2),
    "attainable_flops": dict(peak_flops=1e15),
    "attention_scores_bytes": dict(seq=128, batch=2, heads=4),
    "batch_scaling_efficiency": dict(b0=32.0, s0=1000.0, b=64.0, s=600.0),
    "bucketed_all_reduce_time": dict(total_bytes=1e9, bucket_bytes=25e6, p=8, alpha=5e-6, beta=1e11),
    "bus_bandwidth": dict(op="all_reduce", nbytes=1e9, p=8, seconds=0.01),
    "checkpoint_blocking_time": dict(shard_bytes=1e9, copy_bw=1e10, storage_bw=1e9),
    "checkpoint_overhead": dict(interval_s=600.0, checkpoint_s=30.0, mtbf_s=36000.0),
    "checkpointed_activation_bytes": dict(layers=8, layer_bytes=1e6, k=2),
    "chinchilla_loss": dict(params=1e9, tokens=2e10),
    "chinchilla_optimal": dict(compute_flops=1e21),
    "collective_bytes": dict(op="all_reduce", nbytes=1e6, p=8),
    "collective_time": dict(op="all_reduce", nbytes=1e6, p=8, alpha=5e-6, beta=1e11),
    "cost_per_token": dict(usd_per_gpu_hour=2.0, gpus=8, tokens_per_s=1e5),
    "cp_ring_bytes_per_layer": dict(batch=2, seq=1024, kv_hidden=512, cp=4),
    "critical_batch_size": dict(grad_noise_trace=10.0, grad_norm_sq=2.0),
    "dp_compute_comm_ratio": dict(tokens_per_gpu=4096.0, peak_flops=1e15, beta=1e11),
    "dp_network_intensity": dict(batch_tokens=1e6, gpus=8),
    "dropped_tokens": dict(loads=[10.0, 30.0], capacity=20.0),
    "emergence_loss_gap": dict(probability=0.5, tau=0.1),
    "emergence_probability": dict(loss=2.0, critical_loss=2.1, tau=0.1),
    "ep_all_to_all_bytes": dict(tokens=4096.0, hidden=1024, top_k=2, ep=4),
    "expected_completion_without_checkpoints": dict(work_s=3600.0, mtbf_s=36000.0),
    "expert_capacity": dict(tokens=1024, experts=8),
    "failure_overhead": dict(failures_per_day=2.0, recovery_s=600.0),
    "gpu_hours": dict(flops=1e21, peak_flops=1e15, mfu=0.4),
    "gpus_for_budget": dict(budget_usd=1e6, usd_per_gpu_hour=2.0, hours=720.0),
    "hierarchical_all_reduce_time": dict(nbytes=1e8, gpus_per_node=8, nodes=4, alpha_intra=1e-6, beta_intra=4e11,
                                         alpha_inter=5e-6, beta_inter=5e10),
    "hierarchical_inter_node_bytes": dict(nbytes=1e8, gpus_per_node=8, nodes=4),
    "inflight_microbatches": dict(stages=4, microbatches=8),
    "is_update_swamped": dict(weight=1.0, update=1e-5),
    "kv_cache_bytes": dict(seq=1024, layers=4, kv_heads=4, head_dim=64),
    "layernorm_stats_bytes": dict(batch=2, seq=128),
    "max_loss_scale": dict(max_grad=10.0),
    "megatron_flops": dict(batch=8, seq=1024, layers=4, hidden=512, vocab=32000),
    "mfu": dict(params=1e9, tokens_per_s=1e5, gpus=8, peak_flops=1e15),
    "min_loss_scale": dict(grad_magnitude=1e-6),
    "mla_kv_cache_bytes": dict(seq=1024, layers=4, latent_dim=512),
    "model_state_breakdown": dict(params=1e9),
    "model_state_bytes": dict(params=1e9),
    "moe_params": dict(layers=4, hidden=512, vocab=32000, ffn=2048, heads=8, kv_heads=8, experts=8, top_k=2),
    "offload_gpu_bytes": dict(params=1e9),
    "offload_min_tokens": dict(peak_flops=1e15, link_bw=5e10),
    "optimal_checkpoint_interval": dict(layers=16),
    "overlapped_time": dict(t_compute=1.0, t_comm=0.5),
    "padded_heads": dict(heads=6, tp=4),
    "pipeline_bubble": dict(stages=4, microbatches=8),
    "pipeline_efficiency": dict(stages=4, microbatches=8),
    "powersgd_compression_ratio": dict(rows=1024, cols=1024, rank=4),
    "pp_activation_bytes": dict(batch=2, seq=1024, hidden=512),
    "pp_comm_bytes_total": dict(activation=1e6, stages=4, microbatches=8),
    "prefetch_depth": dict(layer_bytes=1e8, bw=1e10, t_compute=0.005),
    "quantization_compression_ratio": dict(bits=8.0),
    "recompute_overhead": dict(fraction_recomputed=0.5),
    "required_mfu": dict(flops=1e21, seconds=1e6, gpus=64, peak_flops=1e15),
    "ridge_point": dict(peak_flops=1e15, bw=3e12),
    "ring_tree_crossover_bytes": dict(p=8, alpha=5e-6, beta=1e11),
    "roofline_time": dict(flops=1e12, bytes=1e9, peak_flops=1e15, mem_bw=3e12),
    "scaled_learning_rate": dict(lr0=1e-3, b0=32.0, b=64.0),
    "spot_effective_rate": dict(spot_rate=1.0, preempt_probability=0.1, lost_fraction=0.2),
    "stage_balance_efficiency": dict(stage_times=[1.0, 1.2, 0.9]),
    "step_time": dict(params=1e9, batch_tokens=1e6, gpus=8, peak_flops=1e15, mfu=0.4),
    "steps_to_target": dict(batch=256.0, s_min=1000.0, s_noise=100.0),
    "system_mtbf": dict(component_mtbf_s=1e7, count=100),
    "tokens_per_second": dict(params=1e9, gpus=8, peak_flops=1e15, mfu=0.4),
    "topk_compression_ratio": dict(keep_fraction=0.01),
    "tp_comm_bytes": dict(batch=2, seq=1024, hidden=512, layers=4, tp=4),
    "training_cost": dict(flops=1e21, peak_flops=1e15, mfu=0.4, usd_per_gpu_hour=2.0),
    "training_flops": dict(params=1e9, tokens=2e10),
    "training_time": dict(params=1e9, tokens=2e10, gpus=64, peak_flops=1e15, mfu=0.4),
    "transformer_params": dict(layers=4, hidden=512, vocab=32000),
    "ulysses_bytes_per_layer": dict(batch=2, seq=1024, hidden=512, cp=4),
    "young_daly_interval": dict(checkpoint_s=30.0, mtbf_s=36000.0),
    "zero3_comm_time": dict(params=1e9, layers=16, alpha=5e-6, beta=1e11),
    "zero_comm_bytes": dict(params=1e9, dp=8, zero_stage=2),
    "zero_memory_reduction": dict(zero_stage=2, dp=8),
    "algorithm_bandwidth": dict(nbytes=1e9, seconds=0.01),
    "arithmetic_intensity": dict(flops=1e12, bytes=1e9),
    "break_even_hours": dict(tco_usd=3e4, usd_per_gpu_hour=2.0),
    "crossover_bytes": dict(alpha=5e-6, beta=1e11),
    "dp_all_reduce_bytes": dict(params=1e9, dp=8),
    "stage_orders": dict(schedule="1f1b", stages=2, microbatches=4),
    "device_efficiency": dict(kernels=ROOFLINE, model=E.model("llama3_8b"), gpu=gpu("H100-80GB-SXM"), seq_len=1024,
                              micro_batch=1, tp=1),
}
# not plain numbers in, number out: configs, fits, tables, the planner (checked in their own tests)
SKIP = {"cluster", "model", "estimate_layout", "fit_efficiency", "format_table", "plan", "predict_megatron_tflops",
        "tp_all_reduces_per_layer", "predict_train", "grid_search", "hierarchical_search", "evolutionary_search",
        "advise", "check_rules"}
BAD = (math.nan, math.inf, -math.inf)


def _numeric(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _cases():
    for name in sorted(E.__all__):
        fn = getattr(E, name)
        if not inspect.isfunction(fn) or name in SKIP:
            continue
        kwargs = EXAMPLES[name]
        for arg, value in kwargs.items():
            if _numeric(value):
                for bad in BAD:
                    yield pytest.param(name, arg, bad, id=f"{name}-{arg}={bad}")


def test_every_public_function_has_an_example():
    funcs = {n for n in E.__all__ if inspect.isfunction(getattr(E, n))}
    assert funcs - SKIP - set(EXAMPLES) == set()


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_are_valid_calls(name):
    got = getattr(E, name)(**EXAMPLES[name])
    assert got is not None


@pytest.mark.parametrize("name, arg, bad", list(_cases()))
def test_non_finite_numbers_are_refused_by_name(name, arg, bad):
    kwargs = dict(EXAMPLES[name], **{arg: bad})
    with pytest.raises(ValueError, match=rf"^{name}: {arg} "):
        getattr(E, name)(**kwargs)
