"""The book's worked examples (tests/data/book_examples_public.json) recomputed with md.estimate.

One check per example id, with the book's tolerance (exact, or ~1-3% where the book rounds). Where
the book's arithmetic is wrong, the check holds the correct value and says so. Ids that no estimate
function covers are listed in NOT_COVERED with the reason, and skipped.
"""

import json
import math
from pathlib import Path

import pytest

import minidist as md

E = md.estimate
EXAMPLES = {e["id"]: e for e in json.loads((Path(__file__).parent / "data" / "book_examples_public.json").read_text())}
approx = pytest.approx
GB = 1e9


def ex008():
    flops_per_gpu = 6 * 7e9 * 1e6 / 64
    assert flops_per_gpu == approx(6.56e14, rel=0.01)
    assert E.dp_all_reduce_bytes(7e9, 10**9, 2) == approx(2.8e10, rel=0.01)  # 2 Psi s for large dp
    assert E.dp_network_intensity(1e6, 64, 2) == approx(23_400, rel=0.01)
    assert E.dp_network_intensity(0.5e6, 64, 2) == approx(11_700, rel=0.01)


def ex015():
    assert E.ridge_point(989e12, 1e9) == approx(9.89e5, rel=1e-12)


def ex019():
    t = E.collective_time("all_reduce", 10e9, 256, 2e-6, 50e9)
    assert E.collective_time("all_reduce", 0, 256, 2e-6, 50e9) == approx(1.02e-3, rel=0.001)  # latency part
    assert t == approx(0.399, rel=0.005)


def ex023():
    C = E.training_flops(70e9, 2e12)
    assert C == approx(8.4e23, rel=1e-9)
    hours = E.gpu_hours(C, 989e12, 0.45)
    assert hours == approx(524_326, rel=1e-4)  # the book rounds to 525,000 via 1.60e18 FLOPs/GPU-hour
    assert E.training_cost(C, 989e12, 0.45, 4) == approx(2.10e6, rel=0.005)


def ex026():
    t = E.step_time(70e9, 1e6, 128, 989e12, 0.45)
    assert t == approx(7.37, rel=0.002)
    assert 1e6 / t == approx(136_000, rel=0.01)
    days = E.training_time(70e9, 2e12, 128, 989e12, 0.45) / 86400
    assert days == approx(170, rel=0.01)


def ex031():
    assert E.mfu(7e9, 150_000, 64, 989e12) == approx(0.0995, rel=0.002)
    assert E.tokens_per_second(7e9, 64, 989e12, 0.45) == approx(0.68e6, rel=0.01)


def ex032():
    assert E.gpus_for_budget(2e6, 4, 30 * 24) == approx(694, rel=0.001)
    seconds = 30 * 24 * 3600
    assert E.required_mfu(E.training_flops(30e9, 600e9), seconds, 640, 989e12) == approx(0.066, rel=0.01)
    assert E.required_mfu(E.training_flops(30e9, 2e12), seconds, 640, 989e12) == approx(0.22, rel=0.01)


def ex034():
    n, d = E.chinchilla_optimal(1e24)
    assert n == approx(91.3e9, rel=0.001)
    assert d == approx(1.826e12, rel=0.001)  # the book's "~1.82T" is 20 x 91.3B rounded


def ex046():
    assert E.emergence_loss_gap(0.05, 0.1) == approx(-0.294, abs=0.0005)
    assert E.emergence_probability(1.0, 1.0, 0.1) == 0.5


def ex049():
    assert E.batch_scaling_efficiency(512, 50_000, 8192, 6000) == approx(0.52, abs=0.005)


def ex058():
    assert E.ring_tree_crossover_bytes(256, 5e-6, 200e9) == approx(35.3e6, rel=0.002)


def ex060():
    one = E.collective_time("all_reduce", 1e6, 8, 10e-6, 100e9)
    assert one == approx(157.5e-6, rel=1e-9)
    assert E.bucketed_all_reduce_time(1000e6, 1e6, 8, 10e-6, 100e9) == approx(157.5e-3, rel=1e-9)
    fused = E.bucketed_all_reduce_time(1000e6, 25e6, 8, 10e-6, 100e9)
    assert fused == approx(23.1e-3, rel=1e-9)
    assert 157.5e-3 / fused == approx(6.8, abs=0.05)


def ex062():
    # Book slip (outline section 8 #10): it prints T1 = 5.81 ms; 7 us + 7/8 x 2e9/3e11 = 5.84 ms, so the
    # hierarchical total is 20.50 ms, not 20.44. We hold the correct values.
    t1 = E.collective_time("reduce_scatter", 2e9, 8, 1e-6, 300e9)
    assert t1 == approx(5.8403e-3, rel=1e-4)
    hier = E.hierarchical_all_reduce_time(2e9, 8, 8, 1e-6, 300e9, 5e-6, 50e9)
    assert hier == approx(20.50e-3, rel=0.001)
    flat = E.collective_time("all_reduce", 2e9, 64, 5e-6, 50e9)
    assert flat == approx(79.38e-3, rel=0.001)
    assert flat / hier == approx(3.9, abs=0.05)


def ex067():
    assert E.overlapped_time(2000, 600, 0.8) == approx(2120)
    assert 2600 / E.overlapped_time(2000, 600, 0.8) == approx(1.23, abs=0.005)
    assert 2600 / E.overlapped_time(2000, 600, 1.0) == approx(1.30)


def ex070():
    assert E.collective_bytes("all_reduce", 1e9, 4) == approx(1.5e9)
    assert E.hierarchical_inter_node_bytes(1e9, 2, 2) == approx(0.5e9)


def ex071():
    assert E.dp_compute_comm_ratio(1e6, 989e12, 900e9, 2) == approx(1365, rel=0.001)
    b_min = 989e12 * 2 / (3 * 900e9)
    assert E.dp_compute_comm_ratio(b_min, 989e12, 900e9, 2) == approx(1.0)
    assert b_min == approx(733, rel=0.001)  # tokens, though the book says "samples" (outline section 8 #13)


def ex074():
    r = E.topk_compression_ratio(0.01, value_bytes=2, index_bytes=4, dense_bytes=2)
    assert r == approx(33.3, rel=0.002)
    total = 5 + 50 / r + 5
    assert total == approx(11.5, rel=0.001)
    assert 50 / total == approx(4.3, abs=0.05)


def ex080():
    ln = E.layernorm_stats_bytes(4, 2048)
    assert ln == 64 * 1024  # 64 KiB
    activation = 4 * 2048 * 8192 * 2  # b s d fp16 values = 128 MiB, the book's "128 MB"
    assert activation / ln == approx(2000, rel=0.03)  # "~2000x" (exactly 2048)


def ex081():
    assert E.padded_heads(32, 6) == 36
    assert [t for t in range(1, 33) if E.padded_heads(32, t) == 32] == [1, 2, 4, 8, 16, 32]


def ex083():
    assert E.pipeline_bubble(4, 8, "1f1b") == approx(3 / 11)
    # Book slip (outline section 8 #2): ch16 writes the interleaved bubble as (P-1)/(m v) = 3/16, which is
    # bubble / useful time, while its 3/11 for 1F1B is bubble / total. As a fraction of the total the
    # interleaved bubble is 3/19 (the quick reference's formula); 3/16 is the "ideal" convention.
    assert E.pipeline_bubble(4, 8, "interleaved", 2) == approx(3 / 19)
    assert E.pipeline_bubble(4, 8, "interleaved", 2, relative_to="ideal") == approx(3 / 16)


def ex084():
    assert E.pipeline_bubble(8, 48, "gpipe") == approx(7 / 55)
    assert E.pipeline_bubble(8, 48, "interleaved", 2, relative_to="ideal") == approx(7 / 96)
    assert E.pipeline_bubble(8, 48, "interleaved", 2) == approx(7 / 103)  # same slip as ex083, total convention


def ex085():
    act = 32e6
    assert E.inflight_microbatches(4, 16, "gpipe") * act == approx(512e6)
    assert E.inflight_microbatches(4, 16, "1f1b") * act == approx(128e6)


def ex087():
    act = E.pp_activation_bytes(2, 4096, 8192, 2)
    assert act == 2 * 4096 * 8192 * 2  # 134.2e6 B = 128 MiB
    assert 2 * 70e9 / act == approx(1043, rel=0.001)  # book: 1,094x, from 140 GB / 128e6 (MiB read as MB)
    pp = E.pp_comm_bytes_total(act, 8, 32)
    # The book's 57.3 GB multiplies 128e6 (not 134.2e6) bytes; with the exact activation it is 60.1 GB.
    assert pp == approx(60.13e9, rel=0.001)
    assert E.pp_comm_bytes_total(128e6, 8, 32) == approx(57.3e9, rel=0.001)
    assert E.dp_all_reduce_bytes(70e9, 8, 2) == approx(245e9)


def ex092():
    assert E.attention_scores_bytes(262144, 1, 32) == approx(4.4e12, rel=0.01)
    assert E.attention_scores_bytes(262144, 1, 32, cp=8) == approx(68.7e9, rel=0.001)


def ex102():
    assert E.attention_scores_bytes(8192, 1, 32, layers=32) == approx(137.4e9, rel=0.001)


def ex103():
    assert E.model_state_bytes(7e9) == approx(112e9)  # the ch19 activation coefficient is not ours


def ex107():
    for bpp, total, gpus in ((16, 1120e9, 14), (12, 840e9, 11), (8, 560e9, 7)):
        assert E.model_state_bytes(70e9, bytes_per_param=bpp) == approx(total)
        assert math.ceil(total / 80e9) == gpus


def ex111():
    assert E.model_state_bytes(13e9) == approx(208e9)
    # Book slip (outline section 8 #6): ch19 prints 48.25 GB; 26 + 3.25 + 19.5 = 48.75 GB.
    parts = E.model_state_breakdown(13e9, zero_stage=2, dp=8)
    assert (parts["params"], parts["grads"], parts["optimizer"]) == (approx(26e9), approx(3.25e9), approx(19.5e9))
    assert E.model_state_bytes(13e9, zero_stage=2, dp=8) == approx(48.75e9)
    assert E.model_state_bytes(13e9, zero_stage=3, dp=32) == approx(6.5e9)


def ex113():
    t = E.zero3_comm_time(7e9, 32, 10e-6, 100e9)
    assert t == approx(0.96e-3 + 0.420, rel=1e-9)
    per_seq = 6 * 7e9 * 2048 / 150e12
    assert per_seq == approx(0.574, rel=0.001)
    assert t / (0.05 * per_seq) == approx(14.7, abs=0.05)


def ex119():
    assert E.model_state_bytes(70e9, zero_stage=3, dp=64) == approx(17.5e9)
    assert E.optimal_checkpoint_interval(80) == 9


def ex120():
    steady, peak = E.offload_gpu_bytes(10e9)
    assert E.model_state_bytes(10e9) / peak == 4
    assert 40e9 / 32e9 == approx(1.25)
    assert E.offload_min_tokens(312e12, 32e9) == approx(9750)  # the chapter's A100 + PCIe4 figure


def ex126():
    assert E.prefetch_depth(2e9, 32e9, 50e-3) == 2


def ex130():
    assert E.model_state_bytes(175e9, bytes_per_param=14) == approx(2.45e12)
    assert E.model_state_bytes(175e9, bytes_per_param=10) == approx(1.75e12)
    assert E.pipeline_bubble(1024, 4) == approx(1023 / 1027)
    assert E.collective_time("all_reduce", 0, 1024, 1.0, 1.0) == 2046  # latency term: 2046 alpha


def ex132():
    local = 175e9 / (8 * 16)
    parts = E.model_state_breakdown(local, weight_bytes=2, grad_bytes=0, optimizer_bytes=8)  # ch24's 2 + 8
    assert parts["params"] == approx(2.7e9, rel=0.02)
    assert parts["optimizer"] == approx(10.9e9, rel=0.01)
    assert E.pipeline_efficiency(16, 32) == approx(32 / 47)


def ex133():
    assert E.pipeline_efficiency(35, 70) == approx(0.67, abs=0.005)


def ex134():
    assert E.pipeline_bubble(8, 16) == approx(0.30, abs=0.005)
    assert E.pipeline_bubble(8, 16, "interleaved", 4) == approx(0.10, abs=0.005)
    for v, expected in ((1, 0.319), (2, 0.190), (4, 0.105)):
        sched = "1f1b" if v == 1 else "interleaved"
        assert E.pipeline_bubble(16, 32, sched, v) == approx(expected, abs=0.0005)


def ex136():
    local = 175e9 / (8 * 4)
    assert E.model_state_bytes(local) == approx(87.4e9, rel=0.002)
    assert E.model_state_breakdown(local, zero_stage=1, dp=32)["optimizer"] == approx(2.05e9, rel=0.002)
    # the book adds its rounded parts (10.9 + 10.9 + 2.05); unrounded it is 23.93 GB
    assert E.model_state_bytes(local, zero_stage=1, dp=32) == approx(23.85e9, rel=0.005)


def ex141():
    loads = [x * 1000 for x in (0.3, 0.05, 0.25, 0.1, 0.05, 0.1, 0.1, 0.05)]
    # C = ceil(cf T k / E) = ceil(156.25) = 157 (the chapter's formula); the example rounds down to 156.
    cap = E.expert_capacity(1000, 8, 1.25)
    assert cap == 157
    drops = E.dropped_tokens(loads, 156)
    assert (drops[0], drops[2], sum(drops)) == (144, 94, 238)
    assert max(loads) * 8 / 1000 == approx(2.4)  # the capacity factor that drops nothing


def ex142():
    local = 70e9 / (8 * 8)
    assert local == approx(1.09e9, rel=0.005)
    assert E.model_state_bytes(local) == approx(17.5e9)
    # the book adds rounded parts (2.18 + 2.18 + 1.6); unrounded it is 6.02 GB
    assert E.model_state_bytes(local, zero_stage=1, dp=8) == approx(5.96e9, rel=0.01)


def ex147():
    assert E.checkpoint_blocking_time(50e9, 32e9, 2e9) == approx(26.5625)
    assert E.checkpoint_blocking_time(50e9, 32e9, 2e9, asynchronous=True) == approx(1.5625)
    assert E.young_daly_interval(1.5625, 7200) == approx(150)


def ex170():
    assert 1e-4 * 1e-3 < 2.0**-10
    assert E.is_update_swamped(1.0, 1e-4 * 1e-3, "float16")
    assert not E.is_update_swamped(1.0, 1e-4 * 1e-3, "float32")


def ex179():
    per_token_layer = E.kv_cache_bytes(1, 1, 64, 128)
    assert per_token_layer == 32_768
    assert E.kv_cache_bytes(128_000, 1, 64, 128) == approx(4.1e9, rel=0.025)  # exact 4.19 GB
    # the book's 328 GB is 80 x its rounded 4.1 GB; exactly it is 335.5 GB
    assert E.kv_cache_bytes(128_000, 80, 64, 128) == approx(335.5e9, rel=0.001)


def ex193():
    assert E.failure_overhead(10, 300) == approx(0.035, abs=0.0005)
    assert E.failure_overhead(10, 30) == approx(0.0035, abs=0.00005)


def ex196():
    assert 2.788e6 * 2 == approx(5.58e6, rel=0.001)
    ds = E.model("deepseek_v3")
    assert ds.published_layout["gpu_hours"] * E.cluster("h800").usd_per_gpu_hour == approx(5.576e6)


def ex199():
    # The book's formula is ours with tokens_on_this_rank = tokens / E (it takes 4e6 / 256 tokens as this
    # rank's share); we reproduce its 3.3 GB per layer. Its later 3.5 GB is outline section 8 #11.
    v = E.ep_all_to_all_bytes(4e6 / 256, 7168, 8, 16, 2)
    assert v == approx(3.3e9, rel=0.02)


def ex205():
    total, active = E.moe_params(32, 4096, 32000, 14336, 32, 8, 8, 2)
    assert total == approx(46.7e9, rel=0.002)
    assert active == approx(12.9e9, rel=0.01)
    assert active / 7.3e9 == approx(1.8, abs=0.05)


def ex212():
    day = 86400
    t7 = E.training_time(7e9, 20 * 7e9, 64, 989e12, 0.4)
    t70 = E.training_time(70e9, 20 * 70e9, 640, 989e12, 0.4)
    assert 7 * day * t70 / t7 / day == approx(70)


CHECKS = {name: fn for name, fn in globals().items() if name.startswith("ex") and callable(fn)}

NOT_COVERED = {
    "ex018": "plain arithmetic (1e12 / 3e8 s); no estimate function is involved",
    "ex051": "plain arithmetic on update counts; no estimate function is involved",
    "ex101": "process-group arithmetic belongs to the runtime's DeviceMesh, not to md.estimate",
    "ex115": "uses ch21's 20BSH + 4BnS^2 coefficient, which the book itself doubles (outline section 8 #3); "
             "md.estimate uses Korthikanti's sbh(34 + 5as/h)",
    "ex118": "the book's own heuristic helper output, inconsistent with its 180 GB in the same chapter",
    "ex154": "plain arithmetic on survival fractions (10000 x 0.2 x 0.5 x 0.7)",
    "ex166": "book-specific Local SGD cost model with invented constants (outline section 8 #17)",
    "ex185": "the book's rounded post-mortem estimates, not a closed form",
}


def test_every_example_is_checked_or_listed():
    assert set(CHECKS) | set(NOT_COVERED) == set(EXAMPLES)
    assert not set(CHECKS) & set(NOT_COVERED)


@pytest.mark.parametrize("example_id", sorted(EXAMPLES))
def test_book_example(example_id):
    if example_id in NOT_COVERED:
        pytest.skip(NOT_COVERED[example_id])
    CHECKS[example_id]()
