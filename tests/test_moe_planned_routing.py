"""Planned MoE routing (``GPTConfig.expert_load``) is a property of a token's place in the global batch.

A plan deals experts to tokens by their index ``sequence x seq_len + position`` in the global batch, so every
layout routes every token as one device does: each rank reads the global indices of the tokens it holds from its
batch share (``BatchShare.token_index``; the dp x ep rows and the cp positions, contiguous or zigzag; with
micro-batches the index in its global micro-batch). Numbered per
rank instead, dp, cp and ep routed differently from one device (losses off by ~4e-4, weights by ~6e-3).
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
import minidist.nn.moe as moe_module
from minidist.nn.moe import planned_experts
from minidist.parallel import Backend, ParallelConfig, train
from minidist.parallel.context.context_parallel import CPGroup
from minidist.parallel.parallelize import BatchShare

TOL = 1e-12
BATCH, SEQ = 4, 8
# 6 experts, 2 choices: a plan's period (3 tokens) divides neither a dp share (16 tokens) nor a cp chunk (2 or 4
# positions), so numbering tokens per rank would route them differently
LOADS = {"balanced": "balanced", "shares": (0.3, 0.25, 0.15, 0.1, 0.1, 0.1)}
LAYOUTS = {
    "dp2": ParallelConfig(dp=2),
    "cp2-zigzag": ParallelConfig(cp=2),
    "cp2-contiguous": ParallelConfig(cp=2, cp_layout="contiguous"),
    "cp2-ulysses": ParallelConfig(cp=2, cp_method="ulysses"),
    "ep2": ParallelConfig(ep=2),
    "dp2-ep2": ParallelConfig(dp=2, ep=2),
    "tp2": ParallelConfig(tp=2),
    "pp2": ParallelConfig(pp=2),
    "dp2-zero3": ParallelConfig(dp=2, zero_stage=3),
}


def _cfg(load) -> md.GPTConfig:
    return md.GPTConfig(vocab_size=48, seq_len=SEQ, d_model=16, n_layers=2, n_heads=4, n_experts=6, top_k=2, d_ff=16,
                        expert_load=load)


def _recorded_run(cfg, pc: ParallelConfig | None, monkeypatch) -> tuple:
    """Train 3 steps in process and record every planned route the MoE layers took: {global index: experts}."""
    seen: dict[int, set] = {}
    plan = moe_module.planned_experts

    def recording(tokens, n_experts, top_k, load, index=None):
        out = plan(tokens, n_experts, top_k, load, index)
        if index is not None:  # a forward (building a layer checks the plan on one token)
            for i, row in zip(index, out):
                seen.setdefault(int(i), set()).add(tuple(int(e) for e in row))
        return out

    monkeypatch.setattr(moe_module, "planned_experts", recording)
    run = train(cfg, pc, steps=3, global_batch=BATCH, backend="inprocess")
    monkeypatch.setattr(moe_module, "planned_experts", plan)
    return run, seen


_ONE: dict = {}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("load", list(LOADS))
def test_planned_routes_and_training_equal_one_device(load, layout, monkeypatch):
    cfg = _cfg(LOADS[load])
    if load not in _ONE:
        _ONE[load] = _recorded_run(cfg, None, monkeypatch)
    one, one_routes = _ONE[load]
    got, routes = _recorded_run(cfg, LAYOUTS[layout], monkeypatch)
    assert len(one_routes) == BATCH * SEQ and all(len(r) == 1 for r in one_routes.values())
    assert routes == one_routes, f"{layout}: a token took another planned route than on one device"
    loss = max(abs(a - b) for a, b in zip(got.losses, one.losses))
    grad = max(float(np.abs(got.grads[k] - one.grads[k]).max()) for k in one.grads)
    weight = max(float(np.abs(got.params[k] - one.params[k]).max()) for k in one.params)
    assert set(got.params) == set(one.params)
    assert max(loss, grad, weight) < TOL, f"{layout}, {load}: loss {loss:.1e}, gradient {grad:.1e}, weight {weight:.1e}"


@pytest.mark.parametrize("load", list(LOADS.values()), ids=list(LOADS))
def test_a_plan_routes_a_token_by_its_global_index_alone(load):
    whole = planned_experts(40, 6, 2, load)
    index = np.array([37, 3, 12, 0, 39])
    assert (planned_experts(40, 6, 2, load, index) == whole[index]).all()
    with pytest.raises(ValueError, match="MoE: planned routing of token indices 0..40, outside the global batch of 40"):
        planned_experts(40, 6, 2, load, np.array([0, 40]))


@pytest.mark.parametrize("parts,cp", [(2, None), (4, None), (1, (2, "zigzag")), (2, (2, "contiguous")),
                                      (1, (4, "zigzag"))])
def test_the_batch_shares_hold_every_token_once_by_its_global_index(parts, cp):
    """Every rank's share, cut by its rows and its positions, names each token of the global batch exactly once,
    and token (b, t) of a rank's slice of the batch has the global index of its place there."""
    x = np.arange(BATCH * SEQ).reshape(BATCH, SEQ)  # each token id is its own global index
    held = []
    for index in range(parts):
        for r in range(cp[0] if cp else 1):
            share = BatchShare(parts, index, 1, CPGroup(size=cp[0], rank=r, layout=cp[1]) if cp else None)
            xs, _, _ = share.split(x, x)
            ids, total = share.token_index(xs[0].size)
            assert total == BATCH * SEQ and (ids == xs[0].reshape(-1)).all()
            held.append(ids)
    assert sorted(np.concatenate(held).tolist()) == list(range(BATCH * SEQ))


@pytest.mark.parametrize("parts,cp", [(2, None), (1, (2, "zigzag"))])
def test_a_share_cut_into_micro_batches_places_each_token_in_its_global_micro_batch(parts, cp):
    """With micro-batches (an MoE model's ``by_microbatch`` share), micro-batch j of every rank is its piece of the
    global micro-batch j, and the selected micro-batch's tokens are numbered within it; a layer seeing another
    number of tokens than the selected micro-batch holds is refused."""
    x = np.arange(BATCH * SEQ).reshape(BATCH, SEQ)
    mbs = 2
    per = BATCH * SEQ // mbs  # tokens in a global micro-batch
    held = [[] for _ in range(mbs)]
    for index in range(parts):
        for r in range(cp[0] if cp else 1):
            share = BatchShare(parts, index, mbs, CPGroup(size=cp[0], rank=r, layout=cp[1]) if cp else None, True)
            xs, _, _ = share.split(x, x)
            for j in range(mbs):
                share.select(j)
                ids, total = share.token_index(xs[j].size)
                assert total == per and (ids + j * per == xs[j].reshape(-1)).all()
                held[j].append(ids)
    assert all(sorted(np.concatenate(h).tolist()) == list(range(per)) for h in held)
    with pytest.raises(ValueError, match="MoE planned routing: a layer on batch share .* saw 3 tokens, but its "
                                         "micro-batch 1 holds"):
        share.token_index(3)


def test_one_rank_stands_for_others_only_where_every_run_of_its_tokens_is_dealt_evenly():
    """A shape-only run lets one ep rank stand for the others only when their experts receive the same rows. Routed
    by the global index, a rank's tokens come in runs (its rows; each cp chunk of a sequence): each run's
    assignments must divide by the experts. Two chunks of 2 positions, 1 choice, 4 experts: cp rank 0 routes to
    experts 0 and 1 only, so ep rank 1 at that cp coordinate receives no rows and ep rank 0 all of them."""
    kw = dict(steps=1, global_batch=4, backend=Backend("inprocess", shape_only=True))

    def cfg(seq_len):
        return md.GPTConfig(vocab_size=48, seq_len=seq_len, d_model=16, n_layers=1, n_heads=4, n_experts=4, top_k=1,
                            d_ff=16, expert_load="balanced")

    uneven = ParallelConfig(cp=2, ep=2, cp_layout="contiguous")
    with pytest.raises(ValueError, match="stands for ep ranks only when every rank's experts receive the same rows.*"
                                         r"\(got expert_load='balanced', 2 assignments per run\)"):
        train(cfg(4), uneven, **{**kw, "backend": Backend("inprocess", shape_only=True, representatives=True)})
    every = train(cfg(4), uneven, **kw)
    assert len(set(every.peak_memory[:2])) == 2  # the ep ranks at one cp coordinate differ: none can stand for both
    even = ParallelConfig(cp=2, ep=2)  # zigzag chunks of 4 positions: each deals every expert once
    every, some = (train(cfg(16), even, **{**kw, "backend": Backend("inprocess", shape_only=True, representatives=r)})
                   for r in (False, True))
    assert some.time == every.time and list(some.peak_memory) == list(every.peak_memory)
