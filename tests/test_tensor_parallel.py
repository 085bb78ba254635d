"""Tensor and sequence parallelism reproduce the single-device GPT (chapters 15 and 17, lab 09).

float64 throughout: losses equal, gradients (blocks gathered from every rank) equal to rtol 1e-10,
and replicated parameters get bitwise identical gradients on every rank. Then the properties the
book states: 2 all-reduces forward and 2 backward per layer (all-gather / reduce-scatter pairs with
sequence parallelism) with ring bytes equal to ``md.estimate.tp_comm_bytes``; each rank holds 1/tp
of every split matrix; sequence parallelism divides a layer's activations by tp; sizes the group
does not divide are refused by name.
"""

import numpy as np
import pytest

import minidist as md
from minidist.parallel.memory import graph_bytes
from minidist.parallel.tensor.parallel_linear import ColumnParallelLinear, RowParallelLinear
from minidist.parallel.tensor.tensor_parallel import TPGroup
from minidist.parallel.tensor.tensor_parallel_model import (
    check_divisible,
    dense_layers,
    merge_shards,
    shard_axes,
    tensor_parallelize,
)

RTOL, ATOL = 1e-10, 1e-13
BASE = dict(vocab_size=48, seq_len=8, d_model=32, n_layers=2, n_heads=8, n_kv_heads=4, dtype="float64")
KINDS = {
    "gelu_gqa": {},
    "swiglu_rms_tied_nobias": dict(mlp="swiglu", norm="rmsnorm", tie_embeddings=True, bias=False),
    "dropout": dict(dropout=0.1),
}


def config(**kw):
    return md.GPTConfig(**{**BASE, **kw})


def batch(seed=1, b=2, t=8, v=48):
    rng = np.random.default_rng(seed)
    return rng.integers(0, v, (b, t)), rng.integers(0, v, (b, t))


def _run_tp(cfg, sp, x, y, algorithm=None):
    tp = TPGroup.of(None, sequence_parallel=sp, algorithm=algorithm)
    model = tensor_parallelize(md.GPT(cfg, seed=0), tp)
    _, loss = model(x, y)
    t_fwd = md.dist.now()
    loss.backward()
    return {"loss": float(loss.data), "grads": {n: p.grad for n, p in model.named_parameters()},
            "shapes": {n: p.shape for n, p in model.named_parameters()}, "axes": shard_axes(model),
            "dense": dense_layers(model), "t_fwd": t_fwd}


def dense_reference(cfg, x, y):
    model = md.GPT(cfg, seed=0)
    _, loss = model(x, y)
    loss.backward()
    return float(loss.data), {n: p.grad for n, p in model.named_parameters()}, model


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_gpt_equals_single_device(kind, tp, sp):
    cfg = config(**KINDS[kind])
    x, y = batch()
    ref_loss, ref_grads, _ = dense_reference(cfg, x, y)
    out = list(md.launch(_run_tp, world_size=tp, args=(cfg, sp, x, y)))
    for o in out:
        np.testing.assert_allclose(o["loss"], ref_loss, rtol=1e-13)
    grads = merge_shards([o["grads"] for o in out], out[0]["axes"])
    assert set(grads) == set(ref_grads)
    for name, g in ref_grads.items():
        np.testing.assert_allclose(grads[name], g, rtol=RTOL, atol=ATOL, err_msg=name)
    for name, axis in out[0]["axes"].items():
        if axis is None:  # replicated: the same gradient on every rank, bit for bit
            for o in out[1:]:
                assert np.array_equal(o["grads"][name], out[0]["grads"][name]), name


def test_each_rank_holds_its_block_and_no_dense_layer_remains():
    cfg = config()
    x, y = batch()
    _, _, dense = dense_reference(cfg, x, y)
    full = {n: p.shape for n, p in dense.named_parameters()}
    out = list(md.launch(_run_tp, world_size=4, args=(cfg, True, x, y)))
    axes = out[0]["axes"]
    split = [n for n, a in axes.items() if a is not None]
    # every matrix of attention, MLP, embedding and head is split; norms, positions, row biases are not
    assert {"wte.weight", "lm_head.weight", "blocks.0.attn.wq.weight", "blocks.0.attn.wq.bias",
            "blocks.1.attn.wo.weight", "blocks.1.mlp.fc1.weight", "blocks.1.mlp.fc2.weight"} <= set(split)
    assert {"wpe.weight", "blocks.0.ln1.weight", "blocks.0.attn.wo.bias", "blocks.0.mlp.fc2.bias"} <= set(
        n for n, a in axes.items() if a is None)
    for o in out:
        assert o["dense"] == []
        for name, shape in o["shapes"].items():
            want = list(full[name])
            if axes[name] is not None:
                want[axes[name]] //= 4
            assert shape == tuple(want), name
    n_split = sum(int(np.prod(full[n])) for n in split)
    n_rep = sum(int(np.prod(s)) for n, s in full.items() if axes[n] is None)
    assert sum(int(np.prod(s)) for s in out[0]["shapes"].values()) == n_rep + n_split // 4
    assert n_split > 0.9 * (n_split + n_rep)  # the bulk of this model really is divided


def test_parallel_layer_refuses_a_dense_weight():
    tp = TPGroup(None, size=2, rank=1)
    col = ColumnParallelLinear(6, 4, tp, rng=0, dtype="float64")
    row = RowParallelLinear(4, 6, tp, rng=0, dtype="float64")
    assert col.weight.shape == (6, 2) and row.weight.shape == (2, 6) and row.bias.shape == (6,)
    dense = md.nn.Linear(6, 4, rng=0, dtype="float64")
    np.testing.assert_array_equal(col.weight.data, dense.weight.data[:, 2:])  # rank 1's columns
    col.weight.data = dense.weight.data  # someone swaps in the dense matrix
    with pytest.raises(RuntimeError, match=r"ColumnParallelLinear: holds a weight of shape \(6, 4\).*\(6, 2\)"):
        col(md.tensor(np.ones((3, 6))))
    row.weight.data = np.ones((4, 6))
    with pytest.raises(RuntimeError, match="RowParallelLinear"):
        row(md.tensor(np.ones((3, 2))))


def _linear_pair():
    tp = TPGroup.of()
    rng = np.random.default_rng(3)
    x = md.tensor(rng.normal(size=(5, 6)), requires_grad=True)
    col = ColumnParallelLinear(6, 8, tp, rng=1, dtype="float64")
    row = RowParallelLinear(8, 6, tp, rng=2, dtype="float64")
    gathered = ColumnParallelLinear(6, 8, tp, rng=1, dtype="float64", gather_output=True)(x)
    y = row(md.nn.functional.gelu(col(x)))
    t0 = md.dist.now()
    (y * y).sum().backward()
    return y.data, gathered.data, x.grad, col.weight.grad, row.weight.grad, row.bias.grad, t0


@pytest.mark.parametrize("tp", [2, 4])
def test_column_then_row_equals_dense_with_one_all_reduce_each_way(tp):
    res = md.launch(_linear_pair, world_size=tp)
    out = list(res)
    rng = np.random.default_rng(3)
    x = md.tensor(rng.normal(size=(5, 6)), requires_grad=True)
    fc1, fc2 = md.nn.Linear(6, 8, rng=1, dtype="float64"), md.nn.Linear(8, 6, rng=2, dtype="float64")
    y = fc2(md.nn.functional.gelu(fc1(x)))
    (y * y).sum().backward()
    for r, (yr, gath, xg, w1g, w2g, bg, _) in enumerate(out):
        np.testing.assert_allclose(yr, y.data, rtol=RTOL)  # the bias is added once, after the sum
        np.testing.assert_allclose(gath, fc1(x).data, rtol=RTOL)
        np.testing.assert_allclose(xg, x.grad, rtol=RTOL)
        k = 8 // tp
        np.testing.assert_allclose(w1g, fc1.weight.grad[:, r * k:(r + 1) * k], rtol=RTOL)
        np.testing.assert_allclose(w2g, fc2.weight.grad[r * k:(r + 1) * k], rtol=RTOL)
        np.testing.assert_allclose(bg, fc2.bias.grad, rtol=RTOL)
    t0 = out[0][-1]
    ar = [e for e in res.trace if e.rank == 0 and e.stream == "comm" and e.name == "all_reduce"]
    # gather_output's all-gather aside: g (forward) after the row layer, f (backward) before the column one
    assert [e.nbytes for e in ar if e.start < t0] == [5 * 6 * 8]
    assert [e.nbytes for e in ar if e.start >= t0] == [5 * 6 * 8]


def _comm_profile(cfg, tp, sp, x, y):
    """Rank 0's collectives (name, bytes, in the forward?) and the bytes it put on links."""
    res = md.launch(_run_tp_ring, world_size=tp, args=(cfg, sp, x, y))
    t_fwd = list(res)[0]["t_fwd"]
    ev = [e for e in res.trace if e.rank == 0]
    comm = [(e.name, e.nbytes, e.start < t_fwd) for e in ev if e.stream == "comm"]
    sent = sum(e.nbytes for e in ev if e.stream == "link")
    return comm, sent


def _run_tp_ring(cfg, sp, x, y):
    return _run_tp(cfg, sp, x, y, algorithm="ring")


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_collectives_per_layer_and_bytes_equal_the_closed_form(tp, sp):
    x, y = batch()
    b, s, h = x.shape[0], x.shape[1], BASE["d_model"]
    act = b * s * h * 8
    prof = {}
    for L in (1, 3):
        prof[L] = _comm_profile(config(n_layers=L), tp, sp, x, y)

    def count(L, name, nbytes, fwd):
        return sum(1 for n, nb, f in prof[L][0] if n == name and nb == nbytes and f == fwd)

    per = {}  # collectives of activation size added by one layer
    if not sp:
        for fwd in (True, False):
            per[fwd] = (count(3, "all_reduce", act, fwd) - count(1, "all_reduce", act, fwd)) / 2
        assert per == {True: 2, False: 2}
        assert count(1, "all_reduce", act, True) == 2 + 1  # + the embedding's g
        assert count(1, "all_reduce", act, False) == 2 + 1  # + the head's f
    else:
        shard = act // tp
        for name in ("all_gather_into_tensor", "reduce_scatter_tensor"):
            for fwd in (True, False):
                per[name, fwd] = (count(3, name, shard, fwd) - count(1, name, shard, fwd)) / 2
        # forward: AG before each column region, RS after each row one; backward: their mirror images
        # (RS, AG) plus the AG that rebuilds each column region's input from the kept shard
        assert per == {("all_gather_into_tensor", True): 2, ("reduce_scatter_tensor", True): 2,
                       ("all_gather_into_tensor", False): 4, ("reduce_scatter_tensor", False): 2}
        n_tok = b * s  # besides: the cross-entropy's per-token max and sums, the replicated parameters' gradients
        assert {nb for n, nb, _ in prof[3][0] if n == "all_reduce"} == {8 * n_tok, 16 * n_tok, 6 * h * 8, h * 8}
    layer_bytes = (prof[3][1] - prof[1][1]) / 2
    want = md.estimate.tp_comm_bytes(b, s, h, 1, tp, dtype_bytes=8, sequence_parallel=sp)
    if sp:  # plus the one small all-reduce of the block's norm scales/shifts and row biases (6 h numbers)
        want += 2 * (tp - 1) / tp * 6 * h * 8
    assert layer_bytes == pytest.approx(want, rel=1e-12)


def _block_activations(cfg, sp, B):
    tp = TPGroup.of(None, sequence_parallel=sp)
    model = tensor_parallelize(md.GPT(cfg, seed=0), tp)
    rows = cfg.seq_len // tp.size if sp else cfg.seq_len
    x = md.tensor(np.random.default_rng(0).normal(size=(B, rows, cfg.d_model)), requires_grad=True)
    return graph_bytes(model.blocks[0](x), exclude=[x])


def test_sequence_parallel_divides_activation_memory_by_tp():
    """Bytes a layer keeps for the backward, per sequence of the batch (B=2 minus B=1, which removes
    the few parameter-sized arrays the graph also references)."""
    cfg = config(n_layers=1, seq_len=16)

    def per_sequence(t, sp):
        two, one = (list(md.launch(_block_activations, world_size=t, args=(cfg, sp, B)))[0] for B in (2, 1))
        return two - one

    meas = {(t, sp): per_sequence(t, sp) for t in (1, 2, 4) for sp in (False, True)}
    for t in (2, 4):
        assert meas[t, True] * t == meas[1, True]  # every activation of the layer is split t ways
        korthikanti = md.estimate.activation_bytes(16, 2, 32, 8, 1, tp=t, sp=True) / md.estimate.activation_bytes(
            16, 2, 32, 8, 1)
        assert korthikanti == pytest.approx(1 / t)  # (34 + 5as/h) / t
        assert meas[t, True] < meas[t, False]
    # tensor parallelism alone: R + S/t, where R (norms, residual adds, the regions' inputs) stays whole
    m1, m2, m4 = meas[1, False], meas[2, False], meas[4, False]
    assert m1 - m2 == 2 * (m2 - m4)
    assert 0 < 2 * m2 - m1 < m1


@pytest.mark.parametrize("field,value", [("n_heads", 6), ("n_kv_heads", 2), ("d_ff", 34), ("vocab_size", 50)])
def test_sizes_not_divisible_by_tp_are_refused_by_name(field, value):
    kw = dict(d_model=48, n_heads=12, n_kv_heads=4)
    kw[field] = value
    if field == "n_heads":
        kw["n_kv_heads"] = 6
    cfg = config(**kw)
    with pytest.raises(ValueError, match=rf"tp=4 must divide .*{field}={value}"):
        check_divisible(cfg, 4)
    with pytest.raises(ValueError, match=rf"{field}={value}"):
        tensor_parallelize(md.GPT(cfg, seed=0), TPGroup(None, size=4, rank=0))


def test_sequence_length_not_divisible_is_refused_with_sequence_parallelism():
    cfg = config(seq_len=10)
    check_divisible(cfg, 4)  # fine without sequence parallelism
    with pytest.raises(ValueError, match="seq_len=10"):
        check_divisible(cfg, 4, sequence_parallel=True)


def _adamw_steps(cfg, sp, steps, batches):
    tp = TPGroup.of(None, sequence_parallel=sp)
    model = tensor_parallelize(md.GPT(cfg, seed=0), tp)
    opt = md.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    losses = []
    for x, y in batches[:steps]:
        opt.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(float(loss.data))
    return losses, model.state_dict(), shard_axes(model)


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_weights_after_adamw_steps_equal_single_device(sp):
    cfg = config()
    batches = [batch(seed=s) for s in range(3)]
    model = md.GPT(cfg, seed=0)
    opt = md.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ref = []
    for x, y in batches:
        opt.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        ref.append(float(loss.data))
    out = list(md.launch(_adamw_steps, world_size=2, args=(cfg, sp, 3, batches)))
    np.testing.assert_allclose(out[0][0], ref, rtol=1e-12)
    weights = merge_shards([o[1] for o in out], out[0][2])
    for name, p in model.named_parameters():
        # atol: the key bias has a zero gradient (softmax ignores a per-query shift) made of rounding
        # noise that AdamW's normalisation turns into ~1e-13 moves
        np.testing.assert_allclose(weights[name], p.data, rtol=RTOL, atol=1e-12, err_msg=name)


def test_mixture_of_experts_stays_whole_and_sequence_parallel_is_refused():
    cfg = config(n_experts=4, top_k=1)
    model = tensor_parallelize(md.GPT(cfg, seed=0), TPGroup(None, size=2, rank=0))
    assert type(model.blocks[0].mlp).__name__ == "MoE"  # replicated on every tp rank; ep splits the experts
    assert type(model.blocks[0].attn).__name__ == "TensorParallelAttention"
    with pytest.raises(ValueError, match="mixture-of-experts"):
        tensor_parallelize(md.GPT(cfg, seed=0), TPGroup(None, size=2, rank=0, sequence_parallel=True))
