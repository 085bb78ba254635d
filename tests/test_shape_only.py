"""Shape-only arrays: the autograd charges the same ops without computing a value, at any size.

The first piece of the scale simulation: a GPT's forward and backward over ShapeArray weights charge the
roofline exactly the op list (names, FLOPs, bytes, in order) the same step charges with data, views and
copies included; a LLaMA 3 405B-shaped layer then runs in a fraction of a second in a few hundred MB.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minidist as md
from minidist.autograd.cost import set_cost_hook
from minidist.autograd.shape_only import ShapeArray, empty, shape_only

ROOT = Path(__file__).resolve().parents[1]
TOY = dict(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=4)
ARCHS = {
    "gpt": {},
    "llama": dict(n_kv_heads=2, mlp="swiglu", norm="rmsnorm", bias=False),
    "mqa tied": dict(n_kv_heads=1, tie_embeddings=True),
}


def _charges(cfg, shapes_only: bool) -> list:
    ops = []
    model = md.GPT(cfg, 0)
    if shapes_only:
        shape_only(model)
    rng = np.random.default_rng(0)
    idx, tgt = rng.integers(0, cfg.vocab_size, (2, cfg.seq_len)), rng.integers(0, cfg.vocab_size, (2, cfg.seq_len))
    set_cost_hook(lambda name, flops, nbytes, dtype: ops.append((name, flops, nbytes, str(dtype))))
    try:
        _, loss = model(idx, tgt)
        loss.backward()
    finally:
        set_cost_hook(None)
    if shapes_only:
        assert isinstance(loss.data, ShapeArray)
        assert all(isinstance(p.grad, ShapeArray) for p in model.parameters() if p.grad is not None)
    return ops


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_step_charges_the_same_ops_without_values(arch, dtype):
    cfg = md.GPTConfig(**TOY, **ARCHS[arch], dtype=dtype)
    with_data, without = _charges(cfg, False), _charges(cfg, True)
    assert len(with_data) > 100
    assert without == with_data


def test_numpy_decides_views_and_copies_as_for_real_data():
    a = empty((2, 3, 4), np.float32)
    t = a.transpose(0, 2, 1)
    assert np.may_share_memory(t, a) and not t.flags.c_contiguous
    flat = t.reshape(2, 12)  # a copy for real data: a new array here too
    assert isinstance(flat, ShapeArray) and not np.may_share_memory(flat, a)
    assert np.may_share_memory(a.reshape(6, 4), a)  # a view stays a view
    s = a + np.ones(4, np.float32)
    assert isinstance(s, ShapeArray) and s.shape == (2, 3, 4) and s.dtype == np.float32
    assert (t * 2.0).strides == t.copy(order="K").strides  # elementwise results follow their input's layout
    assert (a @ empty((4, 5))).shape == (2, 3, 5)
    assert a.sum(axis=(0, 2), keepdims=True).shape == (1, 3, 1)
    assert a[np.array([0, 1, 1])].shape == (3, 3, 4)


@pytest.mark.parametrize("shapes, axis", [
    ([(2, 3), (4, 3)], 0), ([(2, 3), (2, 5), (2, 1)], 1), ([(2, 3), (2, 5)], -1), ([(2, 3), (3,)], None),
    ([(1, 8, 4), (1, 8, 2), (1, 8, 2)], 2), ([(0, 3), (2, 3)], 0),
])
@pytest.mark.parametrize("real", [False, True], ids=["shape-only", "one real array among them"])
def test_concatenate_gives_numpys_shape_and_dtype(shapes, axis, real):
    dtypes = [np.float16, np.float32, np.float16][: len(shapes)]
    args = [np.zeros(s, d) if real and i == 0 else empty(s, d) for i, (s, d) in enumerate(zip(shapes, dtypes))]
    want = np.concatenate([np.zeros(s, d) for s, d in zip(shapes, dtypes)], axis=axis)
    got = np.concatenate(args, axis=axis)
    assert isinstance(got, ShapeArray) and got.shape == want.shape and got.dtype == want.dtype


def test_concatenate_refuses_what_numpy_refuses():
    with pytest.raises(ValueError):
        np.concatenate([empty((2, 3)), empty((2, 4))], axis=0)
    with pytest.raises((ValueError, np.exceptions.AxisError)):
        np.concatenate([empty((2, 3)), empty((2, 3))], axis=2)


def test_what_depends_on_the_values_is_refused_by_name():
    with pytest.raises(TypeError, match="np.argsort depends on the values"):
        np.argsort(empty((4, 8)), axis=-1)
    with pytest.raises(TypeError, match="truth value depends on the values"):
        bool(empty((1,)) > 0)
    cfg = md.GPTConfig(**TOY, n_experts=4, top_k=2)
    model = shape_only(md.GPT(cfg, 0))
    with pytest.raises(TypeError, match="argsort depends on the values"):  # routing needs a histogram (next)
        model(np.zeros((1, 8), np.int64), np.zeros((1, 8), np.int64))


LARGE = """
import resource, numpy as np, minidist as md
from minidist.autograd.shape_only import building, shape_only
from minidist.autograd.cost import set_cost_hook
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cfg = md.GPTConfig(vocab_size=128256, seq_len=8192, d_model=16384, n_layers=1, n_heads=128, n_kv_heads=8,
                   mlp="swiglu", d_ff=53248, norm="rmsnorm", bias=False, dtype="float16")
with building():
    model = shape_only(md.GPT(cfg, 0))
flops = []
set_cost_hook(lambda name, f, b, d: flops.append(f))
idx = np.zeros((1, 8192), np.int64)
_, loss = model(idx, idx)
loss.backward()
params = sum(p.data.size for p in model.parameters())
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(params, sum(flops), grown)
"""


def test_a_405b_shaped_layer_costs_no_memory():
    """One LLaMA 3 405B layer plus its embeddings: 7.5e9 weights, 15 GB in bf16 with values, and its forward
    and backward charge 6 x params x tokens FLOPs (and the attention), in a few hundred MB here."""
    run = subprocess.run([sys.executable, "-c", LARGE], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    params, flops, grown_mb = map(float, run.stdout.split())
    assert params == pytest.approx(7.52e9, rel=1e-3)
    dense = 6 * 8192 * (params - 128256 * 16384)  # the lookup table is not a matmul
    assert dense < flops < 2 * dense
    assert grown_mb < 1024, f"{grown_mb:.0f} MB"


def test_live_shape_only_arrays_never_share_addresses_and_dead_ones_are_recycled():
    """The address space shape-only arrays are cut from: numpy's view-or-copy answers must be those of separate
    allocations, a range comes back only once its last view is gone, and it is then handed out again."""
    import gc

    a, b = empty((1000, 3), np.float32), empty((1000, 3), np.float32)
    assert not np.may_share_memory(a, b)
    assert np.may_share_memory(a[10:], a) and np.may_share_memory(a.T, a)
    view, where = a[5:], a.__array_interface__["data"][0]
    del a
    gc.collect()
    fresh = [empty((1000, 3), np.float32) for _ in range(64)]  # the view still holds a's range
    assert all(f.__array_interface__["data"][0] != where for f in fresh)
    assert not any(np.may_share_memory(f, view) or np.may_share_memory(f, b) for f in fresh)
    del view, fresh
    gc.collect()
    again = [empty((1000, 3), np.float32) for _ in range(100)]
    assert where in {x.__array_interface__["data"][0] for x in again}  # recycled, not mapped anew
    for size in (0, 1, 4095, 4096, 4097, 3 << 20):  # each on its own range, whatever the size class
        x, y = empty((size,), np.uint8), empty((size,), np.uint8)
        assert x.shape == (size,) and (size == 0 or not np.may_share_memory(x, y))
