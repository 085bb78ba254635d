"""The ledger of md.parallel.train against the memory equation (chapters 19-22, lab 13-14).

Model state: each rank's peak params + grads + optimizer equals md.estimate.model_state_breakdown
with the package's byte sizes (float64 AdamW: 8 + 8 + 16), exactly. Activations: a checkpoint every
k layers holds (L/k) layer inputs + k rebuilt layers, md.estimate.checkpointed_activation_bytes.
"""

import numpy as np
import pytest

import minidist as md
from minidist.estimate import checkpointed_activation_bytes, model_state_breakdown
from minidist.parallel import FlatUnit, ParallelConfig, graph_bytes, state_bytes_per_param, train

# d_model 16: every tensor (and so every unit and bucket) holds a multiple of 4 elements, no padding
CFG = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=4, n_heads=2)


def state(mem):
    return {k: mem[k] for k in ("params", "grads", "optimizer")}


@pytest.mark.parametrize("dp", [1, 2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_model_state_equals_zero_formula(stage, dp):
    r = train(CFG, ParallelConfig(dp=dp, zero_stage=stage, bucket_bytes=16384), steps=1, global_batch=8)
    sb = r.state_bytes
    assert sb == {"params": 8, "grads": 8, "optimizer": 16}
    want = model_state_breakdown(r.num_params, stage, dp, sb["params"], sb["grads"], sb["optimizer"])
    for rank_mem in r.memory:
        assert state(rank_mem) == want
    # the headline numbers: 16 Psi scaled to 32 bytes: 32, 16 + 16/p, 8 + 24/p, 32/p bytes per parameter
    per_param = sum(want.values()) / r.num_params
    assert per_param == {0: 32, 1: 16 + 16 / dp, 2: 8 + 24 / dp, 3: 32 / dp}[stage]


@pytest.mark.parametrize("fsdp", [True, False])
def test_sharded_state_equals_stage3_and_gathers_are_transient(fsdp):
    peaks = []
    for layers in (4, 8):
        cfg = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=layers, n_heads=2)
        r = train(cfg, ParallelConfig(dp=4, zero_stage=0 if fsdp else 3, fsdp=fsdp), steps=1, global_batch=8)
        assert state(r.memory[0]) == model_state_breakdown(r.num_params, 3, 4, 8, 8, 16)
        peaks.append(r.memory[0]["buffers"])
    # gathered layers and gradient buffers are a window of a few layers: deeper models do not need more
    assert 0 < peaks[0] == peaks[1] < r.num_params * 8


def test_mixed_precision_breakdown_is_the_books_16_bytes():
    sb = state_bytes_per_param("float16", "adamw")
    assert sb["params"] + sb["grads"] == 4
    # with a 4-byte master copy beside m and v the breakdown is 2 + 2 + 12 = 16: model_state_bytes' default
    psi = 7e9
    assert model_state_breakdown(psi, 2, 8, 2, 2, 12)["optimizer"] == md.estimate.model_state_bytes(psi, 2, 8) - \
        2 * psi - 2 * psi / 8
    assert state_bytes_per_param("float64", "sgd") == {"params": 8, "grads": 8, "optimizer": 8}


def test_uneven_units_are_padded_explicitly():
    p = md.nn.Parameter(np.arange(10.0))
    u = FlatUnit("u", [("a", p)], world=4, index=3)
    assert (u.shard_size, u.padded, u.padding, u.lo, u.hi) == (3, 12, 2, 9, 12)
    flat = u.flatten([p.data])
    assert flat[10:].tolist() == [0, 0] and u.shard(flat).tolist() == [9, 0, 0]
    assert u.split(flat)["a"].tolist() == list(range(10))
    cfg = md.GPTConfig(vocab_size=41, seq_len=5, d_model=6, n_layers=1, n_heads=2)  # odd sizes everywhere
    r = train(cfg, ParallelConfig(dp=4, zero_stage=3), steps=1, global_batch=4)
    padded_psi = r.memory[0]["params"] / 8 * 4
    assert r.num_params <= padded_psi < r.num_params + 4 * 3  # at most p - 1 padding per unit (3 units)


def activations(recompute, layers=4):
    cfg = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=layers, n_heads=2)
    return train(cfg, ParallelConfig(recompute=recompute), steps=1, global_batch=4)


@pytest.fixture(scope="module")
def plain():
    return activations(None)


def test_activation_ledger_is_measured_from_the_graph(plain):
    log = plain.activations
    layers = [b for what, b in log if what == "segment"]
    assert len(layers) == 4 and len(set(layers)) == 1
    # the ledger's peak is every held activation: embeddings + L layers + head
    assert plain.memory[0]["activations"] == sum(b for _, b in log)
    # and a block's measured bytes are what graph_bytes reports for a standalone block of the same shape
    m = md.GPT(md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=1, n_heads=2, dtype="float64"))
    x = md.tensor(np.random.default_rng(0).normal(size=(4, 8, 16)), requires_grad=True)
    assert graph_bytes(m.blocks[0](x), exclude=[x]) == layers[0]


@pytest.mark.parametrize("k", [1, 2, 4, "full"])
def test_checkpoint_every_k_layers_holds_L_over_k_plus_k_layers(k, plain):
    L = 4
    r = activations(k, L)
    M = next(b for what, b in plain.activations if what == "segment")
    boundary = 4 * 8 * 16 * 8  # one layer input (B, T, d) in float64
    root = sum(b for what, b in plain.activations if what in ("embed", "head"))
    kk = 1 if k == "full" else k
    assert r.memory[0]["activations"] == root + checkpointed_activation_bytes(L, M, kk, boundary)
    rebuilt = [b for what, b in r.activations if what == "rebuilt"]
    assert rebuilt == [kk * M] * (L // kk)
    if k == "full":  # only layer inputs survive the forward
        assert [b for what, b in r.activations if what == "segment"] == [boundary] * L


def test_best_interval_follows_the_closed_form(plain):
    """sqrt(L) is optimal when a kept input costs a whole layer; a real input (B T d) is far cheaper than a
    layer's activations, so the measured optimum moves to smaller k, exactly as the closed form says."""
    L = 9
    M = next(b for what, b in plain.activations if what == "segment")
    boundary = 4 * 8 * 16 * 8
    measured = {k: activations(k, L).memory[0]["activations"] for k in (1, 3, 9)}
    formula = {k: checkpointed_activation_bytes(L, M, k, boundary) for k in (1, 3, 9)}
    assert min(measured, key=measured.get) == min(formula, key=formula.get) == 1
    assert {k: measured[k] - formula[k] for k in measured} == {k: measured[1] - formula[1] for k in measured}
    assert md.estimate.optimal_checkpoint_interval(L) == 3  # with boundary = one layer
    assert min(range(1, L + 1), key=lambda k: checkpointed_activation_bytes(L, M, k)) == 3


def test_selective_recompute_drops_the_attention_scores(plain):
    r = activations("selective")
    B, H, T = 4, 2, 8
    scores = B * H * T * T * 8
    saved = plain.memory[0]["activations"] - r.memory[0]["activations"]
    rebuilt = [b for what, b in r.activations if what == "rebuilt_attention"]
    # every layer stops holding its probabilities (and softmax scratch), one layer's worth comes back
    kept = sum(b for what, b in r.activations if what != "rebuilt_attention")
    per_layer = (plain.memory[0]["activations"] - kept) / 4
    assert per_layer >= scores and per_layer % scores == 0
    assert saved == 4 * per_layer - rebuilt[0]
    assert 0 < saved < plain.memory[0]["activations"] - activations("full").memory[0]["activations"]


def test_offload_moves_optimizer_state_to_the_host():
    for pc, gpu_params in ((ParallelConfig(dp=2, offload="optimizer"), True),
                           (ParallelConfig(dp=2, zero_stage=3, offload="optimizer+params"), False)):
        r = train(CFG, pc, steps=1, global_batch=4)
        stage = pc.zero_stage
        want = model_state_breakdown(r.num_params, stage, 2, 8, 8, 16)
        for gpu, host in zip(r.memory, r.host_memory):
            assert gpu["optimizer"] == 0 and host["optimizer"] == want["optimizer"]
            assert gpu["grads"] == want["grads"]
            assert (gpu["params"], host["params"]) == ((want["params"], 0) if gpu_params else (0, want["params"]))


def test_out_of_memory_names_the_category():
    tiny = md.Cluster(hbm_bytes=100_000)
    with pytest.raises(md.RankError, match="optimizer|params|grads"):
        train(CFG, ParallelConfig(dp=2), steps=1, global_batch=4, cluster=tiny)
    train(CFG, ParallelConfig(dp=4, zero_stage=3, recompute="full"), steps=1, global_batch=4,
          cluster=md.Cluster(hbm_bytes=300_000))  # fits once sharded and recomputed
