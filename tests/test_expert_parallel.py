"""Expert parallelism equals the single-device MoE (chapter 18, lab 12).

Every rank holds its rows of the global batch and E/ep experts. In float64 the outputs, the input
gradients, the router gradient (summed over the group) and each expert's gradient (on its owner)
equal the one-device MoE on the whole batch, with capacity drops included; the all-to-all volumes
equal the routing counts; EP x DP reduces expert gradients over dp only.
"""

import numpy as np
import pytest

import minidist as md
from minidist.nn.moe import MoE, is_expert_param
from minidist.parallel.expert.expert_parallel import EPGroup, expert_parallelize

D, FF, ROWS = 8, 12, 6
TOL = dict(rtol=1e-10, atol=1e-12)


def _data(world, seed=1):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(world * ROWS, D)), rng.normal(size=(world * ROWS, D))


def _moe(E, k, cf, shared=False):
    return MoE(D, FF, E, top_k=k, capacity_factor=cf, shared_expert=shared, rng=3, dtype="float64",
               aux_loss_coef=0.1, z_loss_coef=0.01)


def _grad(p):
    return np.zeros_like(p.data) if p.grad is None else p.grad.copy()  # an expert that got no token


def _oracle(world, E, k, cf, shared=False):
    X, W = _data(world)
    moe = _moe(E, k, cf, shared)
    x = md.tensor(X, requires_grad=True)
    y = moe(x)
    ((y * md.tensor(W)).sum() + moe.aux_loss).backward()
    grads = {n: _grad(p) for n, p in moe.named_parameters()}
    return y.data, x.grad, grads, moe.stats


def _rank(E, k, cf, shared, dp, ep_size):
    from minidist import dist

    rank, world = dist.get_rank(), dist.get_world_size()
    d_i, e_i = divmod(rank, ep_size)
    ep_group = dist.new_group([d_i * ep_size + j for j in range(ep_size)])
    dp_group = dist.new_group([i * ep_size + e_i for i in range(dp)])
    ep = EPGroup.of(ep_group, count_group=None if dp == 1 else dist.new_group())
    moe = expert_parallelize(_moe(E, k, cf, shared), ep)
    X, W = _data(world)
    rows = slice(rank * ROWS, (rank + 1) * ROWS)
    x = md.tensor(X[rows], requires_grad=True)
    t0 = md.dist.now()
    y = moe(x)
    t1 = md.dist.now()
    # the global objective: sum(y W) + mean over ranks of the (equal-sized) local aux losses
    ((y * md.tensor(W[rows])).sum() + moe.aux_loss * (1.0 / world)).backward()
    grads = {}
    for name, p in moe.named_parameters():
        grads[name] = _grad(p)
        dist.all_reduce(grads[name], group=dp_group if is_expert_param(name) else None)
    return {"y": y.data, "gx": x.grad, "grads": grads, "experts": list(ep.experts(E)), "window": (t0, t1),
            "sent": moe.routing.last["send_rows"], "stats": moe.stats}


CASES = [(2, 4, 1, None), (2, 4, 2, 1.0), (4, 4, 1, 1.25), (4, 8, 2, None), (4, 8, 2, 0.75), (2, 8, 1, 0.5)]


@pytest.mark.parametrize("ep,E,k,cf", CASES)
def test_expert_parallel_equals_one_device(ep, E, k, cf):
    y, gx, grads, stats = _oracle(ep, E, k, cf, shared=(E == 8))
    res = md.launch(_rank, world_size=ep, args=(E, k, cf, E == 8, 1, ep))
    for r, out in enumerate(res):
        rows = slice(r * ROWS, (r + 1) * ROWS)
        np.testing.assert_allclose(out["y"], y[rows], **TOL)
        np.testing.assert_allclose(out["gx"], gx[rows], **TOL)
        assert out["experts"] == list(range(r * E // ep, (r + 1) * E // ep))  # E/ep experts per rank
        for name, g in out["grads"].items():  # only local experts are held, under their global names
            np.testing.assert_allclose(g, grads[name], err_msg=name, **TOL)
        held = {int(n.split(".")[1]) for n in out["grads"] if n.startswith("experts.")}
        assert held == set(out["experts"])
        np.testing.assert_array_equal(out["stats"]["kept"], stats["kept"])  # same drops as one device
    if cf is not None and cf < 1:
        assert stats["dropped"] > 0


def _a2a_bytes(res, r):
    """Bytes rank r put on links during its all-to-alls of the forward (dispatch, combine)."""
    t0, t1 = res[r]["window"]
    windows = [(e.start, e.end) for e in res.trace.filter(rank=r, stream="comm", name="all_to_all")
               if t0 <= e.start < t1]
    links = res.trace.filter(rank=r, stream="link")
    return len(windows), [sum(e.nbytes for e in links if a <= e.start < b) for a, b in windows]


@pytest.mark.parametrize("ep,E,k,cf", [(2, 4, 2, 1.0), (4, 8, 1, None)])
def test_all_to_all_volumes_equal_the_routing_counts(ep, E, k, cf):
    res = md.launch(_rank, world_size=ep, args=(E, k, cf, False, 1, ep))
    recv_total = np.zeros(ep, int)
    for r in range(ep):
        sent = res[r]["sent"]  # rows this rank sends to each ep rank
        assert sum(sent) == k * ROWS - res[r]["stats"]["dropped"]
        remote = sum(n for q, n in enumerate(sent) if q != r)
        n, volumes = _a2a_bytes(res, r)
        assert n == 2  # dispatch and combine
        assert volumes[0] == remote * D * 8  # dispatch: the rows whose expert lives elsewhere
        recv_total += np.array(sent)
        combine_rows = sum(res[q]["sent"][r] for q in range(ep) if q != r)  # outputs going back
        assert volumes[1] == combine_rows * D * 8
    # every rank receives exactly the rows routed to its experts
    for r in range(ep):
        experts = res[r]["experts"]
        assert recv_total[r] == sum(res[0]["stats"]["kept"][e] for e in experts)


def test_balanced_routing_matches_the_closed_form():
    # one token per expert per rank, k = 1: (ep-1)/ep of the rows leave, as ep_all_to_all_bytes says
    ep, E = 4, 4

    def fn():
        from minidist import dist

        moe = _moe(E, 1, None)
        moe.router.weight.data[:] = np.eye(D)[:, :E] * 10  # token x = e_j goes to expert j
        expert_parallelize(moe, EPGroup.of())
        x = md.tensor(np.tile(np.eye(D)[:E], (2, 1)))  # 8 tokens, 2 per expert
        t0 = dist.now()
        moe(x)
        return {"window": (t0, dist.now())}

    res = md.launch(fn, world_size=ep)
    for r in range(ep):
        n, volumes = _a2a_bytes(res, r)
        assert sum(volumes) == md.estimate.ep_all_to_all_bytes(2 * E, D, 1, ep, dtype_bytes=8)


def test_expert_parallel_with_data_parallel_reduces_expert_grads_over_dp():
    dp, ep, E, k, cf = 2, 2, 4, 2, 0.75
    y, gx, grads, stats = _oracle(dp * ep, E, k, cf)
    res = md.launch(_rank, world_size=dp * ep, args=(E, k, cf, False, dp, ep))
    for r, out in enumerate(res):
        rows = slice(r * ROWS, (r + 1) * ROWS)
        np.testing.assert_allclose(out["y"], y[rows], **TOL)
        np.testing.assert_allclose(out["gx"], gx[rows], **TOL)
        for name, g in out["grads"].items():
            np.testing.assert_allclose(g, grads[name], err_msg=name, **TOL)
    assert stats["dropped"] > 0
    # experts 0-1 on ep rank 0 of both dp replicas, 2-3 on ep rank 1
    assert [o["experts"] for o in res] == [[0, 1], [2, 3], [0, 1], [2, 3]]


def test_is_expert_param_names():
    assert is_expert_param("experts.3.fc1.weight") and is_expert_param("blocks.0.mlp.experts.0.fc2.bias")
    assert not is_expert_param("blocks.0.mlp.router.weight") and not is_expert_param("blocks.0.mlp.shared.fc1.weight")


def test_errors():
    with pytest.raises(ValueError, match="6 experts cannot be split evenly over ep=4"):
        EPGroup(size=4).experts(6)
    moe = expert_parallelize(_moe(4, 1, None), EPGroup(size=2, rank=1, members=(0, 1)))
    with pytest.raises(IndexError, match="expert 0 is not on this rank"):
        moe.experts[0]


def _token_exchange_kind():
    from minidist.autograd.shape_only import ShapeArray, empty
    from minidist.parallel.expert.expert_parallel import EPGroup, _all_to_all

    return isinstance(_all_to_all(empty((6, 4), np.float32), [3, 3], [3, 3], EPGroup.of()), ShapeArray)


def test_shape_only_token_exchange_stays_shape_only():
    """The all-to-all's output buffer is shape-only for a shape-only input: a real one made the experts' products
    real matmuls, ten times the wall time of a shape-only MoE step for the same simulated step."""
    assert all(md.launch(_token_exchange_kind, world_size=2, backend="inprocess"))
