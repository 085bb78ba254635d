"""md.estimate closed forms beyond the collectives: identities between them, named configs, bad input."""

import math

import pytest

import minidist as md

E = md.estimate
approx = pytest.approx


def test_roofline_is_the_slower_of_compute_and_memory():
    F, bw = 989e12, 3.35e12
    ridge = E.ridge_point(F, bw)
    assert E.roofline_time(ridge * 1e9, 1e9, F, bw) == approx(1e9 / bw)  # at the ridge both agree
    assert E.roofline_time(10 * ridge * 1e9, 1e9, F, bw) == approx(10 * ridge * 1e9 / F)
    assert E.attainable_flops(F, (bw, ridge / 2)) == approx(F / 2)


def test_transformer_params_matches_book_and_published_models():
    L, h, V = 24, 2048, 50000
    assert E.transformer_params(L, h, V) == 12 * L * h * h + 2 * V * h  # the book's 12 L h^2 + 2 V h
    for name in ("gpt3_175b", "llama3_8b", "llama3_70b", "llama3_405b", "mixtral_8x7b", "mixtral_8x22b",
                 "megatron_1p7b", "megatron_145p6b", "megatron_1008p0b"):
        m = E.model(name)
        assert m.architecture_params() == approx(m.params, rel=0.035), name


def test_moe_params_grow_with_experts_and_flops_with_top_k():
    t8, a8 = E.moe_params(4, 512, 1000, 1024, 8, 8, experts=8, top_k=2)
    t16, a16 = E.moe_params(4, 512, 1000, 1024, 8, 8, experts=16, top_k=2)
    assert t16 > t8 and a16 - a8 == 4 * 512 * 8  # only the router grows for active weights
    dense = E.transformer_params(4, 512, 1000, 1024, 8, 8)
    assert E.moe_params(4, 512, 1000, 1024, 8, 8, experts=1, top_k=1) == (dense + 4 * 512, dense + 4 * 512)


def test_training_time_mfu_roundtrip():
    P, D, n, F = 70e9, 2e12, 1024, 989e12
    t = E.training_time(P, D, n, F, 0.4)
    assert E.mfu(P, D / t, n, F) == approx(0.4)
    assert E.tokens_per_second(P, n, F, 0.4) == approx(D / t)


def test_megatron_flops_is_6_psi_plus_attention_without_recompute():
    B, s, L, h, V = 8, 2048, 24, 2304, 51200
    no_rc = E.megatron_flops(B, s, L, h, V, recompute=False)
    assert no_rc == approx(6 * (12 * L * h * h + V * h) * B * s + 12 * B * s * s * h * L)
    rc = E.megatron_flops(B, s, L, h, V)
    assert rc - no_rc == approx(24 * B * s * L * h * h + 4 * B * s * s * h * L)  # one more forward of the layers


@pytest.mark.parametrize("stage,dp,expected", [(0, 64, 1), (1, 64, 4 * 64 / 67), (2, 64, 8 * 64 / 71), (3, 64, 64)])
def test_zero_reduction_factors(stage, dp, expected):
    assert E.zero_memory_reduction(stage, dp) == approx(expected)


def test_zero_matches_published_7p5b_example():
    # Rajbhandari et al. 2020, Figure 1: 7.5B on 64 GPUs -> 120 / 31.4 / 16.6 / 1.9 GB
    for stage, gb in zip(range(4), (120, 31.4, 16.6, 1.875)):
        assert E.model_state_bytes(7.5e9, stage, 64) / 1e9 == approx(gb, rel=0.003)


def test_activation_variants_are_ordered_and_match_korthikanti():
    s, b, h, a, L = 2048, 1, 12288, 96, 4
    sbh = s * b * h
    base = E.activation_bytes(s, b, h, a, L)
    assert base == approx(L * sbh * (34 + 5 * a * s / h))
    tp = E.activation_bytes(s, b, h, a, L, tp=8)
    assert tp == approx(L * sbh * (10 + 24 / 8 + 5 * a * s / (h * 8)))
    sp = E.activation_bytes(s, b, h, a, L, tp=8, sp=True)
    assert sp == approx(base / 8)
    sel = E.activation_bytes(s, b, h, a, L, tp=8, sp=True, recompute="selective")
    assert sel == approx(L * 34 * sbh / 8)
    full = E.activation_bytes(s, b, h, a, L, tp=8, sp=True, recompute="full")
    assert full == approx(L * 2 * sbh / 8)
    assert base > tp > sp > sel > full


def test_checkpoint_interval_minimises_memory():
    L = 96
    k = E.optimal_checkpoint_interval(L)
    cost = [E.checkpointed_activation_bytes(L, 1.0, j) for j in range(1, L + 1)]
    assert cost[k - 1] <= min(cost) + 1  # ceil(L/k) makes neighbours tie within one layer
    assert k in (9, 10) and E.recompute_overhead(1.0) == approx(1 / 3)


def test_kv_cache_gqa_swa_mla():
    mha = E.kv_cache_bytes(8192, 32, 32, 128)
    assert E.kv_cache_bytes(8192, 32, 8, 128) == mha / 4
    assert E.kv_cache_bytes(8192, 32, 32, 128, window=4096) == mha / 2
    ds = E.model("deepseek_v3")
    mla = E.mla_kv_cache_bytes(4096, 1, ds.mla_latent, ds.mla_rope)
    assert E.kv_cache_bytes(4096, 1, 128, 128) / mla == approx(56.9, rel=0.01)  # the ch35 "~57x"


def test_pipeline_conventions_and_schedules():
    p, m = 8, 64
    assert E.pipeline_bubble(p, m, "zb-h1") == approx(0.035, abs=0.0005)  # the outline's verified 3.5%
    assert E.pipeline_bubble(p, m, "zb-h2") == 0
    # DeepSeek-V3 (Table 2): (p/2 - 1)(F&B + B - 3W) = p - 2 with F = I = W = 1, over 3m of work
    assert E.pipeline_bubble(p, m, "dualpipe", relative_to="ideal") == approx((p - 2) / (3 * m))
    assert E.pipeline_bubble(p, m, "dualpipe") < E.pipeline_bubble(p, m, "zb-h1") < E.pipeline_bubble(p, m, "1f1b") / 2
    assert E.inflight_microbatches(p, 4 * p, "dualpipe") == p + 1
    for sched in ("1f1b", "zb-h1", "dualpipe"):
        r = E.pipeline_bubble(p, m, sched, relative_to="ideal")
        assert E.pipeline_bubble(p, m, sched) == approx(r / (1 + r))
    assert E.inflight_microbatches(p, m, "interleaved", 2) == approx(p * (1 + (p - 1) / (2 * p)))
    assert E.stage_balance_efficiency([1, 1, 2]) == approx(4 / 6)


def test_chinchilla():
    n, d = E.chinchilla_optimal(5.88e23)
    assert (n, d) == (approx(70e9, rel=0.01), approx(1.4e12, rel=0.01))  # Chinchilla's own budget
    n2, d2 = E.chinchilla_optimal(5.88e23, method="parametric")
    assert 6 * n2 * d2 == approx(5.88e23)
    # the parametric optimum has the lowest fitted loss on the iso-FLOP curve
    losses = [E.chinchilla_loss(n2 * f, d2 / f) for f in (0.5, 0.8, 1.0, 1.25, 2.0)]
    assert min(losses) == losses[2]
    assert E.chinchilla_loss(70e9, 1.4e12) == approx(1.69 + 406.4 / 70e9**0.34 + 410.7 / 1.4e12**0.28)


def test_scaling_helpers():
    assert E.steps_to_target(1e9, 1000, 5e6) == approx(1000, rel=1e-5)
    assert E.critical_batch_size(12.0, 4.0) == 3.0
    assert E.scaled_learning_rate(1e-3, 256, 1024) == approx(4e-3)
    assert E.scaled_learning_rate(1e-3, 256, 1024, "sqrt") == approx(2e-3)


def test_reliability():
    mtbf = E.system_mtbf(50_000 * 3600, 16384)
    assert mtbf == approx(50_000 * 3600 / 16384)
    assert E.system_mtbf([1000.0, 2000.0], [1, 2]) == approx(500.0)
    i = E.young_daly_interval(60, mtbf)
    grid = [E.checkpoint_overhead(i * f, 60, mtbf) for f in (0.5, 0.9, 1.0, 1.1, 2.0)]
    assert min(grid) == grid[2]  # Young/Daly minimises the first-order overhead
    assert E.expected_completion_without_checkpoints(3600, 1e9) == approx(3600, rel=1e-5)
    assert E.expected_completion_without_checkpoints(10 * 3600, 3600) > 1000 * 3600


def test_economics():
    assert E.training_cost(E.training_flops(70e9, 2e12), 989e12, 0.45, 4) == approx(2.097e6, rel=0.001)
    assert E.spot_effective_rate(1.5, 0.2, 0.5) == approx(1.5 / 0.9)
    assert E.break_even_hours(55_000, 2.5) == 22_000
    assert E.cost_per_token(4, 1000, 1e6) == approx(4000 / 3.6e9)


def test_frontier():
    assert E.powersgd_compression_ratio(4096, 4096, 20) == approx(102.4)  # the outline's verified 102.4x
    assert E.quantization_compression_ratio(2) == 16  # TernGrad vs fp32
    assert [E.min_loss_scale(g) for g in (1e-5, 1e-6, 1e-7, 1e-8)] == [8, 64, 1024, 8192]
    assert E.max_loss_scale(2.0) == 32752.0


def test_strategy_volumes():
    assert E.zero_comm_bytes(1e9, 8, 3) == approx(1.5 * E.zero_comm_bytes(1e9, 8, 1))
    assert E.tp_comm_bytes(1, 2048, 4096, 1, 8) == approx(4 * 2 * 7 / 8 * 2048 * 4096 * 2)
    assert E.tp_all_reduces_per_layer("full") == 6
    assert E.cp_ring_bytes_per_layer(1, 8192, 1024, 4) == approx(2 * 3 / 4 * 8192 * 1024 * 2)
    assert E.ulysses_bytes_per_layer(1, 8192, 4096, 4) == approx(4 * 3 * 8192 * 4096 * 2 / 16)


def test_named_clusters_come_from_hardware_specs():
    from minidist.hardware import specs

    h = E.cluster("dgx-h100")
    assert h.gpu is specs.gpu("H100-80GB-SXM") and h.gpus_per_node == 8
    assert h.intra.beta == specs.link("NVLink4").beta and h.inter.beta == specs.link("IB-NDR400").beta
    assert E.cluster("h800").intra.beta < h.intra.beta  # the export-limited NVLink
    assert set(E.CLUSTERS) == {"dgx-a100", "dgx-h100", "h800"}


def test_every_named_model_has_a_source_and_published_numbers():
    required = {"gpt3_175b", "llama3_8b", "llama3_70b", "llama3_405b", "deepseek_v3", "mixtral_8x7b",
                "mixtral_8x22b", "chinchilla_70b"}
    assert required <= set(E.MODELS)
    assert sum(name.startswith("megatron_") for name in E.MODELS) == 10
    for m in E.MODELS.values():
        assert m.source and m.params > 0 and m.active_params <= m.params
    assert E.model("deepseek_v3").active_params == 37e9
    assert E.model("llama3_405b").published_layout["mfu"] == 0.41


@pytest.mark.parametrize(
    "call,arg",
    [
        (lambda: E.model_state_bytes(-1), "params"),
        (lambda: E.model_state_bytes(1e9, zero_stage=4), "zero_stage"),
        (lambda: E.model_state_bytes(1e9, dp=0), "dp"),
        (lambda: E.activation_bytes(2048, 1, 4096, 32, 32, tp=3), "tp"),
        (lambda: E.activation_bytes(-2048, 1, 4096, 32, 32), "seq"),
        (lambda: E.activation_bytes(2048, 1, 4096, 32, 32, recompute="some"), "recompute"),
        (lambda: E.transformer_params(32, 4096, 32000, heads=30), "heads"),
        (lambda: E.pipeline_bubble(0, 8), "stages"),
        (lambda: E.pipeline_bubble(4, 8, "zigzag"), "schedule"),
        (lambda: E.pipeline_bubble(4, 8, "1f1b", 2), "virtual"),
        (lambda: E.training_time(1e9, 1e12, 8, 1e15, 0), "mfu"),
        (lambda: E.young_daly_interval(-1, 100), "checkpoint_s"),
        (lambda: E.system_mtbf(1000, 0), "count"),
        (lambda: E.chinchilla_optimal(-1), "compute_flops"),
        (lambda: E.kv_cache_bytes(100, 2, 0, 128), "kv_heads"),
        (lambda: E.ridge_point(1e15, 0), "bw"),
        (lambda: E.model("llama5"), "llama5"),
        (lambda: E.cluster("tpu-v9"), "tpu-v9"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(call, arg):
    with pytest.raises(ValueError, match=arg):
        call()


def test_counts_accept_integral_floats_only():
    assert E.collective_time("all_reduce", 8.0, 4.0, 0, 1) == approx(2 * 3 / 4 * 8)
    with pytest.raises(ValueError, match="p"):
        E.collective_time("all_reduce", 8, math.nan, 0, 1)
