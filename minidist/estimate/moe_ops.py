"""The ops of one mixture-of-experts layer on one device, with their FLOPs and bytes (book ch18; labs 12, 18).

Property: routing is sparse, so a MoE layer's work is a sum over the rows each expert receives, and every
op the autograd charges is a product of those row counts and the layer's widths. Given the rows, the list
is exact: this module lists what ``md.nn.MoE`` with expert-parallel routing (``md.parallel.expert.expert_parallel``,
which ``md.parallel.train`` installs for every MoE model, one device included) charges, in the order it
charges them, and ``predict.py`` walks it like the dense ops of ``gpt_ops``.

The rows are where the model meets the data: which expert a token picks depends on the weights and the
tokens, so a prediction made before the run has to assume them. This module assumes balance: each of a
rank's ``t`` tokens picks ``k`` experts, every expert receives ``t k / E`` rows from every rank, and no row
is dropped (no capacity limit). With ``k = E`` (every token to every expert) that is not an assumption
but the fact, and the prediction is exact; with ``k < E`` it is the balanced case, from which a real
routing departs by the imbalance the auxiliary loss fights.

Notation as in ``gpt_ops``: ``t`` tokens of width ``h`` on this rank, ``f`` each expert's hidden width,
``e`` bytes per element; ``E`` experts, ``k`` chosen per token, ``ep`` ranks sharing the experts
(``E / ep`` each), ``count`` ranks whose routing counts are gathered (the data group).
"""

from __future__ import annotations

from minidist.estimate.gpt_ops import (
    TRANSCENDENTAL,
    Op,
    Shard,
    _add,
    _add_backward,
    _done,
    _matmul,
    _matmul_backward,
    activation_bytes,
    block_backward,
    block_forward,
    head_backward,
    head_forward,
)


def _ew(name: str, flops: float, elems: float, e: int) -> Op:
    return Op(name, flops, e * elems)


def rows(x: Shard) -> tuple[float, float, float]:
    """(rows this rank sends, rows it receives, rows each of its experts computes), balanced routing."""
    sent = x.t * x.top_k
    local = x.n_experts // x.ep
    received = sent  # every rank sends t k rows and, by symmetry, receives as many for its experts
    return sent, received, received / local


def router_forward(x: Shard) -> list[Op]:
    """Router logits, softmax, the chosen experts' gates (renormalised when k > 1), the count exchange, and
    the auxiliary losses (Switch's load balance and ST-MoE's z-loss)."""
    t, h, E, k, e = x.t, x.h, x.n_experts, x.top_k, x.e
    ops = [_matmul(t, h, E, e), _ew("softmax", (TRANSCENDENTAL + 3) * t * E, 2 * t * E, e),
           _ew("getitem", 0, 2 * t * k, e)]
    if k > 1:
        ops += [_ew("sum", t * k, t * k + t, e), _ew("div", t * k, 2 * t * k + t, e)]
    if x.count > 1:  # every rank's (k, E) int64 counts, so all drop the same assignments
        ops.append(Op("all_gather", 0, 8 * k * E * x.count, "all_gather", "grad"))
    return ops + [
        _ew("mean", t * E + E, t * E + E, e), _ew("mul", E, 3 * E, e), _ew("sum", E, E + 1, e), _ew("mul", 1, 3, e),
        _ew("sub", t * E, 2 * t * E + t, e), _ew("exp", TRANSCENDENTAL * t * E, 2 * t * E, e),
        _ew("sum", t * E, t * E + t, e), _ew("log", TRANSCENDENTAL * t, 2 * t, e), _ew("add", t, 3 * t, e),
        _ew("mul", 1, 3, e), _ew("mul", t, 3 * t, e), _ew("mean", t + 1, t + 1, e), _ew("mul", 1, 3, e),
        _ew("add", 1, 3, e)]


def _expert(n: float, h: int, f: int, e: int) -> list[Op]:
    return [_matmul(n, h, f, e), _add(n * f, f, e), Op("gelu", (TRANSCENDENTAL + 7) * n * f, 2 * e * n * f),
            _matmul(n, f, h, e), _add(n * h, h, e)]


def _expert_backward(n: float, h: int, f: int, e: int) -> list[Op]:
    return [_done(_add_backward(n * h, h, e), h), _done(_matmul_backward(n, f, h, e), f * h),
            Op("gelu.backward", 10 * n * f, 3 * e * n * f), _done(_add_backward(n * f, f, e), f),
            _done(_matmul_backward(n, h, f, e), h * f), _ew("getitem.backward", n * h, 2 * n * h, e)]


def moe_forward(x: Shard) -> list[Op]:
    """The layer after its norm: route, dispatch, the local experts, combine, weight by the gates and sum."""
    t, h, f, k, e = x.t, x.h, x.ff, x.top_k, x.e
    sent, received, each = rows(x)
    a2a = Op("all_to_all", 0, e * h * sent, "all_to_all", "ep")  # the rows a rank holds, as collective_time counts
    ops = router_forward(x) + [_ew("getitem", 0, 2 * sent * h, e)]
    if x.ep > 1:
        ops.append(a2a)
    ops.append(_ew("getitem", 0, 2 * received * h, e))  # regrouped expert by expert
    for _ in range(x.n_experts // x.ep):
        ops += _expert(each, h, f, e)
    ops += [_ew("cat", 0, 2 * received * h, e), _ew("getitem", 0, 2 * received * h, e)]
    if x.ep > 1:
        ops.append(a2a)
    return ops + [_ew("cat", 0, 2 * (sent + 1) * h, e), _ew("getitem", 0, 2 * t * k * h, e),
                  _ew("mul", t * k * h, 2 * t * k * h + t * k, e), _ew("sum", t * k * h, t * k * h + t * h, e)]


def moe_backward(x: Shard) -> list[Op]:
    """The forward's ops in reverse (the auxiliary losses' first: they hang off the loss itself)."""
    t, h, f, E, k, e = x.t, x.h, x.ff, x.n_experts, x.top_k, x.e
    sent, received, each = rows(x)
    a2a = Op("all_to_all", 0, e * h * sent, "all_to_all", "ep")
    ops = [_ew("add.backward", 0, 5, e), _ew("mul.backward", 1, 4, e), _ew("mean.backward", t, t + 1, e),
           _ew("mul.backward", 2 * t, 5 * t, e), _ew("add.backward", 0, 4 * t, e),
           _ew("log.backward", t, 3 * t, e), _ew("sum.backward", 0, t + t * E, e),
           _ew("exp.backward", t * E, 3 * t * E, e), _ew("sub.backward", t * E, 3 * t * E + t, e),
           _ew("mul.backward", 1, 4, e), _ew("mul.backward", 1, 4, e), _ew("sum.backward", 0, E + 1, e),
           _ew("mul.backward", E, 4 * E, e), _ew("mean.backward", t * E, t * E + E, e)]
    ops += [_ew("sum.backward", 0, t * h + t * k * h, e), _ew("mul.backward", 2 * t * k * h, 4 * t * k * h + t * k, e)]
    if k > 1:
        ops += [_ew("div.backward", 4 * t * k, 4 * t * k + t, e), _ew("sum.backward", 0, t * k + t, e)]
    ops += [_ew("getitem.backward", t * k, 2 * t * k, e),
            _ew("softmax.backward", 4 * t * E, 3 * t * E, e), _done(_matmul_backward(t, h, E, e), h * E),
            _ew("getitem.backward", t * k * h, 2 * t * k * h, e), _ew("cat.backward", 0, 2 * (sent + 1) * h, e)]
    if x.ep > 1:
        ops.append(a2a)
    ops += [_ew("getitem.backward", received * h, 2 * received * h, e), _ew("cat.backward", 0, 2 * received * h, e)]
    for _ in range(E // x.ep):
        ops += _expert_backward(each, h, f, e)
    ops.append(_ew("getitem.backward", received * h, 2 * received * h, e))
    if x.ep > 1:
        ops.append(a2a)
    return ops + [_ew("getitem.backward", sent * h, 2 * sent * h, e)]


def moe_activation_bytes(x: Shard) -> float:
    """Bytes the layer keeps for the backward (``md.parallel.memory.graph_bytes`` of the block, less the dense
    MLP's ``e t (4 f + 2 h)``).

    Floats: the router's logits and probabilities (``2 t E``), the gates (``t k``, and their sum and the
    renormalised gates when k > 1), the output (``t h``); the dispatched rows and their regrouped copy, the
    experts' concatenated output and its reordering (``4`` rows of ``h`` each), the same with the zero row the
    dropped read (``sent + 1``), the rows picked back per token and their gated product (``2 t k h``); each
    expert ``2`` rows of ``h`` and ``4`` of ``f`` (as the dense MLP per token); under expert parallelism the
    two all-to-alls' outputs. Integers (8 bytes): the token and expert indices (``t + t E``), each assignment's
    slot (``t k``), three row orders (``3`` per row) and the offsets of the two concatenations.
    """
    t, h, f, E, k, e = x.t, x.h, x.ff, x.n_experts, x.top_k, x.e
    sent, received, each = rows(x)
    local = E // x.ep
    floats = (2 * t * E + t * k + (t + t * k if k > 1 else 0) + t * h + 2 * t * k * h + (sent + 1) * h
              + sent * h + 3 * received * h + local * each * (2 * h + 4 * f))
    if x.ep > 1:  # what the two all-to-alls deliver
        floats += received * h + sent * h
    ints = t + t * E + t * k + 3 + (local + 1) + sent + 2 * received
    return e * floats + 8 * ints


def moe_parameters(x: Shard, layers: int) -> tuple[list[int], list[list[int]]]:
    """This rank's parameters (element counts) in registration order: (the dense ones, every local expert's),
    as the two reducers of ``md.parallel.expert.expert_data_parallel`` bucket them."""
    h, hq, v = x.h, x.hq, x.v
    block = [h, h] + [h * hq, hq] * 3 + [hq * h, h] + [h, h, h * x.n_experts]
    dense = [x.vocab * h, x.s * x.cp * h] + block * layers + [h, h, h * v]
    experts = [[h * x.ff, x.ff, x.ff * h, h] for _ in range(layers * (x.n_experts // x.ep))]
    return dense, experts


def moe_block_forward(x: Shard) -> list[Op]:
    return block_forward(x, moe_forward(x))


def moe_block_backward(x: Shard) -> list[Op]:
    return block_backward(x, moe_backward(x))


def moe_head_forward(x: Shard, layers: int) -> list[Op]:
    """The head, with the loss plus every layer's auxiliary loss (``layers`` scalar additions before the
    final scaling)."""
    ops = head_forward(x)
    return ops[:-1] + [_ew("add", 1, 3, x.e)] * layers + ops[-1:]


def moe_head_backward(x: Shard, layers: int) -> list[Op]:
    ops = head_backward(x)
    return ops[:1] + [_ew("add.backward", 0, 5, x.e)] * layers + ops[1:]


def moe_block_activation_bytes(x: Shard) -> float:
    """A block's activations with the mixture of experts in place of the dense MLP."""
    return activation_bytes(x)["block"] - x.e * x.t * (4 * x.ff + 2 * x.h) + moe_activation_bytes(x)
