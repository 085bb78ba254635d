"""``md.parallel.train`` with ``ParallelConfig(tp=..., sequence_parallel=...)`` reproduces one device
(chapter 15, lab 09): float64, 3 AdamW steps, alone and composed with data parallelism, ZeRO, FSDP, gradient
accumulation and recomputation; each rank's ledger holds its 1/tp of the split parameters.
"""

import numpy as np
import pytest

import minidist as md
from minidist.parallel import ParallelConfig, train

CFG = md.GPTConfig(vocab_size=48, seq_len=8, d_model=32, n_layers=2, n_heads=8, n_kv_heads=4)
STEPS, BATCH = 3, 8
RTOL, ATOL = 1e-10, 1e-12


@pytest.fixture(scope="module")
def oracle():
    return train(CFG, ParallelConfig(), steps=STEPS, global_batch=BATCH)


LAYOUTS = {
    "tp2": ParallelConfig(tp=2),
    "tp4": ParallelConfig(tp=4),
    "tp2_sp": ParallelConfig(tp=2, sequence_parallel=True),
    "tp4_sp": ParallelConfig(tp=4, sequence_parallel=True),
    "dp2_tp2": ParallelConfig(dp=2, tp=2),
    "dp2_tp2_sp": ParallelConfig(dp=2, tp=2, sequence_parallel=True),
    "dp2_tp2_sp_zero1": ParallelConfig(dp=2, tp=2, sequence_parallel=True, zero_stage=1),
    "dp2_tp2_fsdp": ParallelConfig(dp=2, tp=2, fsdp=True),
    "tp2_sp_accumulate_full_recompute": ParallelConfig(tp=2, sequence_parallel=True, microbatches=2,
                                                       recompute="full"),
    "tp2_sp_selective": ParallelConfig(tp=2, sequence_parallel=True, recompute="selective"),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_equals_single_device(name, oracle):
    r = train(CFG, LAYOUTS[name], steps=STEPS, global_batch=BATCH)
    np.testing.assert_allclose(r.losses, oracle.losses, rtol=RTOL, atol=ATOL)
    assert set(r.params) == set(oracle.params) and set(r.grads) == set(oracle.grads)
    for key in oracle.params:
        np.testing.assert_allclose(r.grads[key], oracle.grads[key], rtol=RTOL, atol=ATOL, err_msg=key)
        np.testing.assert_allclose(r.params[key], oracle.params[key], rtol=RTOL, atol=ATOL, err_msg=key)
    if r.rank_params is not None:  # data-parallel replicas of the tensor-parallel model: bitwise equal
        assert len(r.rank_params) == LAYOUTS[name].dp
        for other in r.rank_params[1:]:
            for key, w in r.rank_params[0].items():
                assert np.array_equal(w, other[key]), key
    assert r.num_params == oracle.num_params


@pytest.mark.parametrize("tp", [2, 4])
def test_each_rank_ledger_holds_its_share_of_parameters(tp, oracle):
    r = train(CFG, ParallelConfig(tp=tp, sequence_parallel=True), steps=1, global_batch=BATCH)
    model = md.GPT(CFG, seed=0)
    split = ("wte", "lm_head", "wq", "wk", "wv", "wo.weight", "fc1", "fc2.weight")
    n_split = sum(p.data.size for n, p in model.named_parameters() if any(s in n for s in split))
    n_rep = model.num_parameters() - n_split
    assert n_rep < 0.05 * model.num_parameters()  # norms, positions and row biases only
    for mem in r.memory:
        assert mem["params"] == (n_rep + n_split / tp) * 8
        assert mem["grads"] == (n_rep + n_split / tp) * 8
    assert oracle.memory[0]["params"] == model.num_parameters() * 8


def test_sequence_parallel_holds_less_activation_memory():
    peaks = {sp: train(CFG, ParallelConfig(tp=2, sequence_parallel=sp), steps=1, global_batch=BATCH).memory[0][
        "activations"] for sp in (False, True)}
    assert peaks[True] < peaks[False]


def test_train_refuses_sizes_tp_does_not_divide():
    with pytest.raises(ValueError, match=r"tp=4 must divide .*vocab_size=50"):
        train(md.GPTConfig(vocab_size=50, seq_len=8, d_model=16, n_layers=1, n_heads=4), ParallelConfig(tp=4))
