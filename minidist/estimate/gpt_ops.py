"""The ops of one GPT micro-batch on one device, each with its FLOPs and bytes (book ch2-3a; labs 01, 18).

Property: the roofline prices an op from two counts, ``max(flops / peak, bytes / hbm_bw)``, and both
counts of every op of a transformer are products of the layer's shapes. Listing the ops of
minidist's GPT (pre-norm blocks, separate q/k/v projections with biases, GELU MLP, learned position
embeddings, untied head) with the counts the autograd charges gives the compute time of any
layout before anything runs: a tensor-parallel rank has the same list with heads, MLP width and
vocabulary divided by ``tp``, plus the all-reduces Megatron's ``f`` and ``g`` operators add.

Counts, for ``t = b s`` tokens of width ``h``, local widths ``hq`` (query/key/value/out projection
columns), ``f`` (MLP) and ``v`` (vocabulary), ``e`` bytes per element, ``pairs = b heads s^2``:
- matmul ``(t, k) @ (k, n)``: ``2 t k n`` FLOPs, ``e (t k + k n + t n)`` bytes; its backward twice both.
- elementwise ops read their operands and write their output; their backward reads the gradient and the
  operands and writes one gradient per input. A layer norm costs ``8`` FLOPs per element (``10`` back).
- attention (the fused scaled-dot-product op) is charged over all ``pairs`` (the causal mask is
  applied, not skipped): ``4 d pairs + 8 pairs`` FLOPs forward with ``e`` times q, k, v and the output in
  bytes; the backward reads the probabilities twice.
- activations kept for the backward per block: ``e (t (19 h' + 4 f + 2) + pairs)`` on one device
  (measured from the autograd graph and explained in ``activation_bytes``).
A mixture of experts in place of the MLP is listed in ``moe_ops.py``; sequence parallelism is not listed
yet: ``check_supported`` refuses what is not covered by name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

TRANSCENDENTAL = 4  # FLOPs the autograd charges for exp, tanh, log


@dataclass(frozen=True)
class Op:
    """One compute op (``kind="compute"``: FLOPs and bytes) or one collective over an axis of the mesh
    (``kind`` the collective's name, ``nbytes`` the buffer as ``md.estimate.collective_time`` counts it)."""

    name: str
    flops: float
    nbytes: float
    kind: str = "compute"
    axis: str = ""
    grads: tuple[int, ...] = ()  # parameters (element counts) whose gradient is final once this op is done
    steps: tuple = ()  # ring attention: per step of the ring, the (flops, bytes) of each block it computes


def _done(op: Op, *sizes: int) -> Op:
    return replace(op, grads=sizes)


@dataclass(frozen=True)
class Shard:
    """The shapes one device sees for one micro-batch: ``b`` sequences of ``s`` tokens, model width ``h``,
    ``heads`` attention heads, MLP width ``ff``, vocabulary ``vocab``, split ``tp`` ways, ``e`` bytes per
    element. With context parallelism ``s`` is this rank's share of the sequence, ``cp`` the ring's size."""

    b: int
    s: int
    h: int
    heads: int
    ff: int
    vocab: int
    tp: int = 1
    e: int = 8
    cp: int = 1
    n_experts: int = 0  # a mixture of experts in place of the MLP (moe_ops.py): E experts, top_k per token,
    top_k: int = 0  # split over ep ranks, routing counts gathered over the ``count`` ranks of the data group
    ep: int = 1
    count: int = 1

    @property
    def t(self) -> int:
        return self.b * self.s

    @property
    def hq(self) -> int:
        return self.h // self.tp

    @property
    def f(self) -> int:
        return self.ff // self.tp

    @property
    def v(self) -> int:
        return self.vocab // self.tp

    @property
    def pairs(self) -> int:
        return self.b * (self.heads // self.tp) * self.s * self.s

    @property
    def heads_copied(self) -> bool:
        """Whether (B, heads, T, d) -> (B, T, heads d) must copy: a transpose of a size-1 axis is still a view."""
        return self.heads // self.tp > 1 and self.s > 1


def _matmul(rows: int, k: int, n: int, e: int) -> Op:
    return Op("matmul", 2 * rows * k * n, e * (rows * k + k * n + rows * n))


def _matmul_backward(rows: int, k: int, n: int, e: int) -> Op:
    # both input gradients: each reads the output gradient and the two operands, writes one input's size
    return Op("matmul.backward", 4 * rows * k * n, 2 * e * (rows * n + rows * k + k * n))


def _row_parallel_backward(rows: int, k: int, n: int, e: int, tp: int) -> list[Op]:
    """A row-parallel linear's backward runs its two products as plain matmuls (same counts in all)."""
    if tp == 1:
        return [_done(_matmul_backward(rows, k, n, e), k * n)]
    return [_matmul(rows, n, k, e), _done(_matmul(k, rows, n, e), k * n)]


def _add(big: int, small: int, e: int) -> Op:
    """``x + y`` with y of ``small`` elements broadcast over x's ``big`` (small = big: same shapes)."""
    return Op("add", big, e * (2 * big + small))


def _add_backward(big: int, small: int, e: int) -> Op:
    return Op("add.backward", 0, e * (3 * big + big + small))


def _all_reduce(nbytes: float, axis: str = "tp") -> Op:
    return Op("all_reduce", 0, nbytes, "all_reduce", axis)


def embed_forward(x: Shard) -> list[Op]:
    """Token rows (a vocabulary block under tp, masked and summed over the group), plus positions."""
    t, h, s, e = x.t, x.h, x.s, x.e
    ops = [Op("embedding", 0, 8 * t + 2 * e * t * h)]
    if x.tp > 1:  # rows of other ranks' blocks are zeroed by a (t, 1) mask, then g sums over the group
        ops += [Op("mul", t * h, e * (2 * t * h + t)), _all_reduce(e * t * h)]
    return ops + [Op("embedding", 0, 8 * s + 2 * e * s * h), Op("add", t * h, e * (2 * t * h + s * h))]


def embed_backward(x: Shard) -> list[Op]:
    t, h, s, e = x.t, x.h, x.s, x.e
    ops = [Op("add.backward", 0, e * (3 * t * h + t * h + s * h)),
           _done(Op("embedding.backward", s * h, 8 * s + 2 * e * s * h), s * x.cp * h)]
    if x.tp > 1:
        ops.append(Op("mul.backward", t * h, e * (2 * t * h + t * h + t)))
    return ops + [_done(Op("embedding.backward", t * h, 8 * t + 2 * e * t * h), x.v * h)]


def zigzag_pairs(cp: int, rank: int, src: int) -> int:
    """Blocks rank ``rank`` computes when it holds ``src``'s keys, the sequence cut into ``2 cp`` chunks and
    rank r holding chunks r and 2 cp - 1 - r (``md.parallel.context_parallel``'s zigzag): a query chunk
    skips a key chunk that lies wholly in its future."""
    mine, theirs = (rank, 2 * cp - 1 - rank), (src, 2 * cp - 1 - src)
    return sum(1 for q in mine for k in theirs if k <= q)


def _ring(x: Shard, backward: bool) -> Op:
    """Ring attention on rank 0 of the ring (with the zigzag cut every rank computes as many blocks at every
    step, so rank 0 stands for all): the K/V block in flight is ``2 t hq`` elements; each block is a
    (chunk x chunk) attention over the local heads, its backward recomputing the scores."""
    c, d, e = x.s // 2, x.h // x.heads, x.e
    rows = x.b * (x.heads // x.tp)
    pairs = rows * c * c
    if backward:
        block = (2 * pairs * d + 2 * pairs * 4 * d + (TRANSCENDENTAL + 4) * pairs, e * rows * c * d * 8)
    else:
        block = (2 * pairs * 2 * d + (TRANSCENDENTAL + 4) * pairs, e * rows * c * d * 4)
    steps = tuple((block,) * zigzag_pairs(x.cp, 0, (0 - t) % x.cp) for t in range(x.cp))
    name = "ring_attention" + (".backward" if backward else "")
    return Op(name, 0, 2 * e * x.t * x.hq, "ring", "cp", steps=steps)


def block_forward(x: Shard, mlp: list[Op] | None = None) -> list[Op]:
    """ln1, q/k/v (+bias), attention, merge heads, out projection (+g, +bias), residual; ln2, fc1 (+bias),
    GELU, fc2 (+g, +bias), residual. ``mlp``: other ops in place of fc1 .. fc2's bias (a mixture of experts)."""
    t, h, hq, f, e = x.t, x.h, x.hq, x.f, x.e
    d = h // x.heads
    ln = Op("layer_norm", 8 * t * h, 2 * e * t * h)
    ops = [ln]
    for _ in "qkv":
        ops += [_matmul(t, h, hq, e), _add(t * hq, hq, e)]
    if x.cp > 1:
        ops.append(_ring(x, backward=False))
    else:
        ops.append(Op("scaled_dot_product_attention", 4 * d * x.pairs + (TRANSCENDENTAL + 4) * x.pairs,
                      4 * e * t * hq))
    if x.heads_copied:
        ops.append(Op("reshape", 0, 2 * e * t * hq))
    ops.append(_matmul(t, hq, h, e))
    if x.tp > 1:
        ops.append(_all_reduce(e * t * h))
    ops += [_add(t * h, h, e), _add(t * h, t * h, e), ln]
    if mlp is None:
        mlp = [_matmul(t, h, f, e), _add(t * f, f, e), Op("gelu", (TRANSCENDENTAL + 7) * t * f, 2 * e * t * f),
               _matmul(t, f, h, e)] + ([_all_reduce(e * t * h)] if x.tp > 1 else []) + [_add(t * h, h, e)]
    return ops + mlp + [_add(t * h, t * h, e)]


def block_backward(x: Shard, mlp: list[Op] | None = None) -> list[Op]:
    """The forward's ops in reverse; each weight's gradient is final after the op that computes it."""
    t, h, hq, f, e = x.t, x.h, x.hq, x.f, x.e
    d = h // x.heads
    ln = _done(Op("layer_norm.backward", 10 * t * h, 3 * e * t * h), h, h)
    if mlp is None:
        mlp = [_done(_add_backward(t * h, h, e), h), *_row_parallel_backward(t, f, h, e, x.tp),
               Op("gelu.backward", 10 * t * f, 3 * e * t * f), _done(_add_backward(t * f, f, e), f),
               _done(_matmul_backward(t, h, f, e), h * f)] + ([_all_reduce(e * t * h)] if x.tp > 1 else [])
    ops = [_add_backward(t * h, t * h, e), *mlp]
    # the merge of heads needs no copy back: the incoming gradient is contiguous, its reshape a view
    ops += [ln, _add_backward(t * h, t * h, e), _done(_add_backward(t * h, h, e), h),
            *_row_parallel_backward(t, hq, h, e, x.tp)]
    if x.cp > 1:
        ops.append(_ring(x, backward=True))
    else:
        ops.append(Op("scaled_dot_product_attention.backward", 8 * d * x.pairs + 4 * x.pairs,
                      e * (3 * t * hq + 2 * x.pairs + 4 * t * hq)))
    for name in "vkq":
        # a gradient laid out (B, heads, T, d) is copied back into (B, T, heads d); ring attention builds q's in
        # q's own memory order (zeros_like keeps it), so only k's and v's are copied there
        if x.heads_copied and not (name == "q" and x.cp > 1):
            ops.append(Op("reshape.backward", 0, 2 * e * t * hq))
        ops += [_done(_add_backward(t * hq, hq, e), hq), _done(_matmul_backward(t, h, hq, e), h * hq)]
    if x.tp > 1:
        ops.append(_all_reduce(e * t * h))
    return ops + [ln]


def head_forward(x: Shard) -> list[Op]:
    """ln_f, the (vocabulary-parallel) head, the cross-entropy (its max and sums all-reduced under tp)."""
    t, h, v, e = x.t, x.h, x.v, x.e
    ops = [Op("layer_norm", 8 * t * h, 2 * e * t * h), _matmul(t, h, v, e)]
    if x.tp > 1:
        ops += [_all_reduce(e * t), _all_reduce(2 * e * t)]
    return ops + [Op("cross_entropy", (TRANSCENDENTAL + 4) * t * v, e * t * v + 8 * t + e),
                  Op("mul", 1, 3 * e)]


def head_backward(x: Shard) -> list[Op]:
    t, h, v, e = x.t, x.h, x.v, x.e
    ops = [Op("mul.backward", 1, 4 * e), Op("cross_entropy.backward", 3 * t * v, 2 * e * t * v),
           _done(_matmul_backward(t, h, v, e), h * v)]
    if x.tp > 1:
        ops.append(_all_reduce(e * t * h))
    return ops + [_done(Op("layer_norm.backward", 10 * t * h, 3 * e * t * h), h, h)]


def parameters(x: Shard, layers: int) -> list[int]:
    """This rank's parameters (element counts) in registration order: the reverse of the order in which the
    backward finishes their gradients."""
    order = [n for op in head_backward(x) + block_backward(x) * layers + embed_backward(x) for n in op.grads]
    return order[::-1]


def optimizer_bytes(params: float, e: int, optimizer: str = "adamw") -> float:
    """HBM traffic of one elementwise optimizer step over ``params`` weights: AdamW reads the weight, the
    gradient and both moments and writes the weight and both moments (7 arrays); SGD with momentum 4."""
    return (7 if optimizer == "adamw" else 4) * e * params


def activation_bytes(x: Shard) -> dict[str, float]:
    """Bytes each unit keeps for its backward (one micro-batch): ``embed``, one ``block``, ``head``.

    Counted in the autograd graph (``md.parallel.memory.graph_bytes``), per token: a block keeps ``10 h``
    elements at full width (norm inputs and outputs, residual sums, the projections' outputs), ``9 hq`` of
    the local heads (q, k, v before and after their biases and heads split, the attention output and the
    merged heads), ``4 f`` of the MLP (fc1 before and after its bias, GELU's output and its saved input),
    2 norm statistics, plus the attention probabilities (``pairs``). Under tensor parallelism the
    embedding also keeps its masked rows and their sum (``2 t h + t``), and the vocabulary-parallel loss
    keeps its probabilities once (``t v``) instead of the logits and their softmax (``2 t v``).
    """
    t, h, s, e = x.t, x.h, x.s, x.e
    embed = e * (2 * t * h + s * h) + 8 * (t + s)
    merged = 9 if x.heads_copied else 8  # merging one head is a view, not a new buffer
    block = e * (t * (10 * h + merged * x.hq + 4 * x.f + 2) + x.pairs)
    if x.cp > 1:  # ring attention keeps neither the probabilities nor a separate output of its own
        block -= e * (x.pairs + t * x.hq)
    # the loss keeps its targets' row indices as int64 (8 bytes a token whatever the dtype): ``rows`` and ``tt``
    # of cross_entropy, ``local`` of the vocabulary-parallel loss
    if x.tp == 1:
        head = e * (2 * t * x.v + 2 * t * h + 2 * t + 1) + 17 * t
    else:
        embed += e * (2 * t * h + t)
        head = e * (t * x.v + 2 * t * h + t + 1) + 8 * t
    return {"embed": embed, "block": block, "head": head}
