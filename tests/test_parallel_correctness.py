"""Every layout of md.parallel.train reproduces the single-device run (chapters 14 and 19-22, labs 08, 13, 14).

float64, 3 AdamW steps: losses every step, the last step's gradients and the final weights match the
one-device oracle to rtol 1e-10; replicated layouts keep bitwise identical weights on every rank.
"""

import numpy as np
import pytest

import minidist as md
from minidist.parallel import SGD, AdamW, ParallelConfig, train

CFG = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2)
STEPS, BATCH = 3, 8
RTOL, ATOL = 1e-10, 1e-12


@pytest.fixture(scope="module")
def oracle():
    return train(CFG, ParallelConfig(), steps=STEPS, global_batch=BATCH)


def assert_same(r, ref):
    np.testing.assert_allclose(r.losses, ref.losses, rtol=RTOL, atol=ATOL)
    assert set(r.params) == set(ref.params) and set(r.grads) == set(ref.grads)
    for name in ref.params:
        np.testing.assert_allclose(r.grads[name], ref.grads[name], rtol=RTOL, atol=ATOL, err_msg=name)
        np.testing.assert_allclose(r.params[name], ref.params[name], rtol=RTOL, atol=ATOL, err_msg=name)
    if r.rank_params is not None:  # replicas: bitwise equal on every rank
        for other in r.rank_params[1:]:
            for name, w in r.rank_params[0].items():
                assert np.array_equal(w, other[name]), name


def test_oracle_is_plain_training():
    """The one-device run is GPT.forward + backward + md.optim.AdamW, step by step."""
    res = train(CFG, ParallelConfig(), steps=STEPS, global_batch=BATCH, optimizer=AdamW(lr=1e-3, weight_decay=0.01))
    tokens, _ = md.data.load_tokens(20_000, seed=0)
    model = md.GPT(md.GPTConfig(**{**CFG.__dict__, "dtype": "float64"}), seed=0)
    opt = md.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    rng = np.random.default_rng([0, 2])
    losses = []
    for _ in range(STEPS):
        x, y = md.data.get_batch(tokens, BATCH, CFG.seq_len, rng)
        opt.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(float(loss.data))
    np.testing.assert_allclose(res.losses, losses, rtol=1e-13)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(res.params[name], p.data, rtol=1e-12, atol=1e-15, err_msg=name)
    assert res.losses[-1] < res.losses[0]


LAYOUTS = {
    "dp2": ParallelConfig(dp=2),
    "dp4_small_buckets": ParallelConfig(dp=4, bucket_bytes=4096),
    "dp4_accumulate": ParallelConfig(dp=4, microbatches=2, bucket_bytes=8192),
    "dp1_accumulate": ParallelConfig(microbatches=4),
    "zero1_dp2": ParallelConfig(dp=2, zero_stage=1, bucket_bytes=8192),
    "zero1_dp4_accumulate": ParallelConfig(dp=4, zero_stage=1, microbatches=2),
    "zero2_dp2_accumulate": ParallelConfig(dp=2, zero_stage=2, microbatches=2, bucket_bytes=8192),
    "zero2_dp4": ParallelConfig(dp=4, zero_stage=2),
    "zero3_dp2": ParallelConfig(dp=2, zero_stage=3),
    "zero3_dp4_prefetch2": ParallelConfig(dp=4, zero_stage=3, prefetch=2),
    "zero3_dp1": ParallelConfig(zero_stage=3),
    "fsdp_dp4_accumulate": ParallelConfig(dp=4, fsdp=True, microbatches=2),
    "fsdp_dp2_noprefetch": ParallelConfig(dp=2, fsdp=True, prefetch=0),
    "recompute_full_dp2": ParallelConfig(dp=2, recompute="full"),
    "recompute_k2_zero3": ParallelConfig(dp=2, zero_stage=3, recompute=2),
    "recompute_selective_fsdp": ParallelConfig(dp=2, fsdp=True, recompute="selective"),
    "recompute_full_zero2_accumulate": ParallelConfig(dp=2, zero_stage=2, recompute="full", microbatches=2),
    "offload_optimizer_dp2": ParallelConfig(dp=2, offload="optimizer"),
    "offload_optimizer_zero2": ParallelConfig(dp=4, zero_stage=2, offload="optimizer"),
    "offload_params_zero3": ParallelConfig(dp=2, zero_stage=3, offload="optimizer+params"),
    "offload_params_fsdp1": ParallelConfig(fsdp=True, offload="optimizer+params", recompute=1),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_single_device(name, oracle):
    assert_same(train(CFG, LAYOUTS[name], steps=STEPS, global_batch=BATCH), oracle)


@pytest.mark.parametrize("pc", [ParallelConfig(dp=2), ParallelConfig(dp=4), ParallelConfig(dp=3, microbatches=2),
                                ParallelConfig(dp=4, zero_stage=3), ParallelConfig(dp=2, zero_stage=2,
                                                                                   microbatches=3)],
                         ids=["dp2", "dp4", "dp3_mb2", "zero3_dp4", "zero2_dp2_mb3"])
def test_uneven_shards_are_weighted(pc):
    """7 sequences over 2, 3 or 4 ranks (and uneven micro-batches): each share weighted by its size."""
    ref = train(CFG, ParallelConfig(), steps=2, global_batch=7)
    assert_same(train(CFG, pc, steps=2, global_batch=7), ref)


def test_tied_embeddings_and_sgd_under_data_parallelism():
    cfg = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=1, n_heads=2, tie_embeddings=True)
    for opt in (AdamW(lr=0.05), SGD(lr=0.05)):
        ref = train(cfg, ParallelConfig(), steps=2, global_batch=6, optimizer=opt)
        assert_same(train(cfg, ParallelConfig(dp=2, zero_stage=1), steps=2, global_batch=6, optimizer=opt), ref)
    # the tied matrix is one unit with the head under ZeRO-3 (and in FSDP's root), gathered until its backward
    ref = train(cfg, ParallelConfig(), steps=2, global_batch=6)
    for pc in (ParallelConfig(dp=2, zero_stage=3), ParallelConfig(dp=2, fsdp=True, recompute="full")):
        assert_same(train(cfg, pc, steps=2, global_batch=6), ref)


def test_without_loss_scaling_the_gradient_would_be_wrong(oracle):
    """Sanity of the oracle comparison: a different batch split in time changes the numbers."""
    other = train(CFG, ParallelConfig(), steps=STEPS, global_batch=BATCH, seed=1)
    assert abs(other.losses[0] - oracle.losses[0]) > 1e-6


@pytest.mark.parametrize("kwargs, match", [
    (dict(pp=2, virtual_stages=2), r"virtual_stages=2 needs schedule='interleaved'"),
    (dict(zero_stage=4), "zero_stage"),
    (dict(fsdp=True, zero_stage=2), "fsdp"),
    (dict(recompute="sometimes"), "recompute"),
    (dict(recompute=0), "recompute"),
    (dict(offload="nvme"), "offload"),
    (dict(offload="optimizer+params"), "zero_stage=3"),
    (dict(dp=0), "dp must be"),
])
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ParallelConfig(**kwargs)


def test_train_rejects_bad_runs():
    with pytest.raises(ValueError, match="global_batch"):
        train(CFG, ParallelConfig(dp=4, microbatches=2), global_batch=4)
    with pytest.raises(ValueError, match="dropout"):
        train(md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=1, n_heads=2, dropout=0.1))
    with pytest.raises(ValueError, match="vocab_size"):
        train(md.GPTConfig(vocab_size=20, seq_len=8, d_model=16, n_layers=1, n_heads=2))
