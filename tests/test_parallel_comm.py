"""Traffic and time of md.parallel.train on the simulated clock (chapters 14, 20, 22; labs 08, 13, 14).

Bytes each rank sends per step (from the trace's link events) equal the closed forms: DP = ZeRO-1 =
ZeRO-2 = 2 (p-1)/p Psi s, ZeRO-3 = 1.5 x that. Bucketing lets the all-reduce overlap the backward
and makes the step faster; offloading's PCIe copies cost alpha + n/beta and are double-buffered.
"""

import pytest

import minidist as md
from minidist.estimate import dp_all_reduce_bytes, zero_comm_bytes
from minidist.parallel import ParallelConfig, build_mesh, split_sizes, train

CFG = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2)
UNIFORM = md.Cluster.uniform(alpha=1e-6, beta=1e10)


@pytest.mark.parametrize("dp", [2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bytes_per_step_equal_closed_forms(stage, dp):
    pc = ParallelConfig(dp=dp, zero_stage=stage, algorithm="ring", bucket_bytes=8192)
    r = train(CFG, pc, steps=2, global_batch=8, cluster=UNIFORM)
    want = zero_comm_bytes(r.num_params, dp, stage, dtype_bytes=8)
    for step in r.comm_bytes:
        assert step == [want] * dp
    if stage == 3:
        assert want == 1.5 * dp_all_reduce_bytes(r.num_params, dp, 8)


def test_fsdp_root_is_gathered_once():
    """FSDP keeps its root unit (embeddings, final norm, head) gathered through the step: one gather fewer."""
    dp = 4
    r = train(CFG, ParallelConfig(dp=dp, fsdp=True, algorithm="ring"), steps=1, global_batch=8, cluster=UNIFORM)
    root = 48 * 16 + 8 * 16 + 2 * 16 + 16 * 48
    want = zero_comm_bytes(r.num_params, dp, 3, 8) - (dp - 1) / dp * root * 8
    assert r.comm_bytes[0] == [want] * dp


def test_accumulation_communicates_once_with_no_sync():
    one = train(CFG, ParallelConfig(dp=2, algorithm="ring"), steps=1, global_batch=8, cluster=UNIFORM)
    acc = train(CFG, ParallelConfig(dp=2, microbatches=4, algorithm="ring"), steps=1, global_batch=8,
                cluster=UNIFORM)
    assert acc.comm_bytes == one.comm_bytes  # DDP no_sync: one all-reduce per step, not per micro-batch
    z2 = train(CFG, ParallelConfig(dp=2, zero_stage=2, microbatches=4, algorithm="ring"), steps=1,
               global_batch=8, cluster=UNIFORM)
    rs = dp_all_reduce_bytes(z2.num_params, 2, 8) / 2
    assert z2.comm_bytes[0] == [4 * rs + rs] * 2  # ZeRO-2 reduce-scatters every micro-batch, gathers once


BIG = md.GPTConfig(vocab_size=48, seq_len=16, d_model=32, n_layers=4, n_heads=2)
FAST = md.Cluster.uniform(alpha=1e-7, beta=1e11)


def test_bucketing_overlaps_backward_and_is_faster():
    one = train(BIG, ParallelConfig(dp=2, bucket_bytes=1e12, algorithm="ring"), steps=1, global_batch=8,
                cluster=FAST)
    many = train(BIG, ParallelConfig(dp=2, bucket_bytes=2**16, algorithm="ring"), steps=1, global_batch=8,
                 cluster=FAST)
    assert many.time[0] < 0.95 * one.time[0]
    assert many.comm_bytes == one.comm_bytes  # same bytes, only the schedule changed

    def overlap(r):
        backward = [e for e in r.trace.filter(rank=0, stream="compute") if e.name.endswith(".backward")]
        reduces = list(r.trace.filter(rank=0, stream="comm", name="all_reduce"))
        last_backward = max(e.end for e in backward)
        return sum(min(e.end, last_backward) - e.start for e in reduces if e.start < last_backward)

    assert len(list(many.trace.filter(rank=0, stream="comm", name="all_reduce"))) > 1
    assert overlap(one) == 0  # one bucket: the all-reduce can only start after the whole backward
    assert overlap(many) > 0


def test_zero3_prefetch_hides_gathers():
    slow = md.Cluster.uniform(alpha=1e-7, beta=3e10)
    none = train(BIG, ParallelConfig(dp=2, zero_stage=3, prefetch=0), steps=1, global_batch=8, cluster=slow)
    ahead = train(BIG, ParallelConfig(dp=2, zero_stage=3, prefetch=1), steps=1, global_batch=8, cluster=slow)
    assert ahead.time[0] < none.time[0]
    assert ahead.comm_bytes == none.comm_bytes


def test_offload_transfers_are_alpha_beta_and_double_buffered():
    link = md.hardware.specs.link("PCIe5-x16")
    r = train(BIG, ParallelConfig(offload="optimizer"), steps=1, global_batch=4)
    host = list(r.trace.filter(rank=0, stream="host"))
    d2h = [e for e in host if e.name.startswith("d2h:")]
    h2d = [e for e in host if e.name.startswith("h2d:")]
    assert len(d2h) == len(h2d) > 2
    for e in d2h + h2d:
        assert e.duration == pytest.approx(link.alpha + e.nbytes / link.beta, rel=1e-12)
    assert sum(e.nbytes for e in d2h) == sum(e.nbytes for e in h2d) == r.num_params * 8
    serial = sum(e.duration for e in host)
    span = max(e.end for e in host) - min(e.start for e in host)
    assert span < serial  # copies of piece i+1 run while piece i is updated
    # double buffering: piece i+2 leaves the device only after piece i came back
    for a, b in zip(h2d, d2h[2:]):
        assert b.start >= a.end


def test_the_mesh_owns_rank_arithmetic():
    mesh = build_mesh(ParallelConfig(dp=4), rank=2)
    assert mesh.mesh_dim_names == ("pp", "dp", "ep", "cp", "tp")
    assert mesh.get_coordinate() == (0, 2, 0, 0, 0)
    assert mesh.get_group("dp").ranks == (0, 1, 2, 3) and mesh.get_group("tp").ranks == (2,)
    assert mesh.get_local_rank("dp") == 2 and mesh.size("dp") == 4 and mesh.size() == 4
    with pytest.raises(ValueError, match="outside"):
        build_mesh(ParallelConfig(dp=2), rank=2)
    with pytest.raises(KeyError, match="no dimension"):
        mesh.get_group("xx")
    assert split_sizes(7, 3) == [3, 2, 2] and split_sizes(8, 4) == [2, 2, 2, 2]
