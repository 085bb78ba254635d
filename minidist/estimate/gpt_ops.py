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
    shape: tuple = ()  # what the autograd reports beside the counts (``autograd.cost``): products, attention, rows


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
    kv_heads: int = 0  # grouped-query attention: key/value heads (0: as many as query heads)
    mlp: str = "gelu"  # or "swiglu"
    norm: str = "layernorm"  # or "rmsnorm"
    bias: bool = True

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
    def kv(self) -> int:
        """Local key/value width: every head's keys when ``kv_heads`` is 0, fewer under grouped-query attention."""
        return self.h // self.heads * (self.kv_heads or self.heads) // self.tp

    @property
    def gqa(self) -> bool:
        return bool(self.kv_heads) and self.kv_heads != self.heads

    @property
    def kv_copied(self) -> bool:
        return (self.kv_heads or self.heads) // self.tp > 1 and self.s > 1

    @property
    def pairs(self) -> int:
        return self.b * (self.heads // self.tp) * self.s * self.s

    @property
    def heads_copied(self) -> bool:
        """Whether (B, heads, T, d) -> (B, T, heads d) must copy: a transpose of a size-1 axis is still a view."""
        return self.heads // self.tp > 1 and self.s > 1


def _attention_shape(x: Shard) -> tuple:
    """(batch x local heads, queries, keys, d, dv): the attention probabilities' shape, as the autograd reports it."""
    d = x.h // x.heads
    return (x.b * (x.heads // x.tp), x.s, x.s, d, d)


def _matmul(rows: int, k: int, n: int, e: int) -> Op:
    return Op("matmul", 2 * rows * k * n, e * (rows * k + k * n + rows * n), shape=(1, rows, k, n))


def _matmul_backward(rows: int, k: int, n: int, e: int) -> Op:
    # both input gradients: each reads the output gradient and the two operands, writes one input's size
    return Op("matmul.backward", 4 * rows * k * n, 2 * e * (rows * n + rows * k + k * n), shape=(1, rows, k, n))


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
    rank r holding chunks r and 2 cp - 1 - r (``md.parallel.context.context_parallel``'s zigzag): a query chunk
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


def _norm(x: Shard) -> Op:
    t, h, e = x.t, x.h, x.e
    if x.norm == "rmsnorm":
        return Op("rms_norm", 5 * t * h, 2 * e * t * h)
    return Op("layer_norm", 8 * t * h, 2 * e * t * h)


def _norm_backward(x: Shard) -> Op:
    t, h, e = x.t, x.h, x.e
    if x.norm == "rmsnorm":
        return _done(Op("rms_norm.backward", 7 * t * h, 3 * e * t * h), h)
    return _done(Op("layer_norm.backward", 10 * t * h, 3 * e * t * h), *((h, h) if x.bias else (h,)))


def _linear(rows: int, k: int, n: int, x: Shard, bias: bool = True) -> list[Op]:
    """A linear layer's product and, when the model has biases (and ``bias``: a row-parallel layer adds its
    bias after the reduction), its bias."""
    return [_matmul(rows, k, n, x.e)] + ([_add(rows * n, n, x.e)] if x.bias and bias else [])


def _linear_backward(rows: int, k: int, n: int, x: Shard) -> list[Op]:
    return ([_done(_add_backward(rows * n, n, x.e), n)] if x.bias else []) + \
        [_done(_matmul_backward(rows, k, n, x.e), k * n)]


def _mlp_forward(x: Shard) -> list[Op]:
    t, h, f, e = x.t, x.h, x.f, x.e
    down = [_matmul(t, f, h, e)] + ([_all_reduce(e * t * h)] if x.tp > 1 else []) + \
        ([_add(t * h, h, e)] if x.bias else [])
    if x.mlp == "swiglu":
        silu, mul = Op("silu", 7 * t * f, 2 * e * t * f), Op("mul", t * f, 3 * e * t * f)
        gate, up = _linear(t, h, f, x), _linear(t, h, f, x)
        if x.tp > 1:  # the column-parallel pair runs both products first
            return gate + up + [silu, mul] + down
        return gate + [silu] + up + [mul] + down
    return _linear(t, h, f, x) + [Op("gelu", (TRANSCENDENTAL + 7) * t * f, 2 * e * t * f)] + down


def _mlp_backward(x: Shard) -> list[Op]:
    t, h, f, e = x.t, x.h, x.f, x.e
    ops = ([_done(_add_backward(t * h, h, e), h)] if x.bias else []) + _row_parallel_backward(t, f, h, e, x.tp)
    if x.mlp == "swiglu":
        ops += [Op("mul.backward", 2 * t * f, 5 * e * t * f), *_linear_backward(t, h, f, x),
                Op("silu.backward", 5 * t * f, 3 * e * t * f), *_linear_backward(t, h, f, x)]
    else:
        ops += [Op("gelu.backward", 10 * t * f, 3 * e * t * f), *_linear_backward(t, h, f, x)]
    return ops + ([_all_reduce(e * t * h)] if x.tp > 1 else [])


def block_forward(x: Shard, mlp: list[Op] | None = None) -> list[Op]:
    """norm1, q/k/v (+bias), the key/value heads repeated (grouped-query attention), attention, merge heads,
    out projection (+g, +bias), residual; norm2, the MLP (fc1 (+bias), GELU, fc2; or SwiGLU's gate, up and
    down), residual. ``mlp``: other ops in place of the MLP (a mixture of experts)."""
    t, h, hq, e = x.t, x.h, x.hq, x.e
    d = h // x.heads
    ops = [_norm(x), *_linear(t, h, hq, x), *_linear(t, h, x.kv, x), *_linear(t, h, x.kv, x)]
    if x.gqa:  # keys and values repeated to every query head they serve
        ops += [Op("cat", 0, 2 * e * t * hq)] * 2
    if x.cp > 1:
        ops.append(_ring(x, backward=False))
    else:
        ops.append(Op("scaled_dot_product_attention", 4 * d * x.pairs + (TRANSCENDENTAL + 4) * x.pairs,
                      4 * e * t * hq, shape=_attention_shape(x)))
    if x.heads_copied:
        ops.append(Op("reshape", 0, 2 * e * t * hq))
    ops.append(_matmul(t, hq, h, e))
    if x.tp > 1:
        ops.append(_all_reduce(e * t * h))
    ops += ([_add(t * h, h, e)] if x.bias else []) + [_add(t * h, t * h, e), _norm(x)]
    return ops + (_mlp_forward(x) if mlp is None else mlp) + [_add(t * h, t * h, e)]


def block_backward(x: Shard, mlp: list[Op] | None = None) -> list[Op]:
    """The forward's ops in reverse; each weight's gradient is final after the op that computes it."""
    t, h, hq, e = x.t, x.h, x.hq, x.e
    d = h // x.heads
    ops = [_add_backward(t * h, t * h, e), *(_mlp_backward(x) if mlp is None else mlp)]
    # the merge of heads needs no copy back: the incoming gradient is contiguous, its reshape a view
    ops += [_norm_backward(x), _add_backward(t * h, t * h, e)]
    ops += ([_done(_add_backward(t * h, h, e), h)] if x.bias else []) + _row_parallel_backward(t, hq, h, e, x.tp)
    if x.cp > 1:
        ops.append(_ring(x, backward=True))
    else:
        ops.append(Op("scaled_dot_product_attention.backward", 8 * d * x.pairs + 4 * x.pairs,
                      e * (3 * t * hq + 2 * x.pairs + 4 * t * hq), shape=_attention_shape(x)))
    for name in "vkq":
        width = hq if name == "q" else x.kv
        if x.gqa and name != "q":
            ops.append(Op("cat.backward", 0, 2 * e * t * hq))
        # a gradient laid out (B, heads, T, d) is copied back into (B, T, heads d); ring attention builds q's in
        # q's own memory order (zeros_like keeps it), so only k's and v's are copied there
        copied = x.heads_copied if name == "q" else x.kv_copied
        if copied and not (name == "q" and x.cp > 1):
            ops.append(Op("reshape.backward", 0, 2 * e * t * width))
        ops += _linear_backward(t, h, width, x)
    if x.tp > 1:
        ops.append(_all_reduce(e * t * h))
    return ops + [_norm_backward(x)]


def head_forward(x: Shard) -> list[Op]:
    """ln_f, the (vocabulary-parallel) head, the cross-entropy (its max and sums all-reduced under tp)."""
    t, h, v, e = x.t, x.h, x.v, x.e
    ops = [_norm(x), _matmul(t, h, v, e)]
    if x.tp > 1:
        ops += [_all_reduce(e * t), _all_reduce(2 * e * t)]
    return ops + [Op("cross_entropy", (TRANSCENDENTAL + 4) * t * v, e * t * v + 8 * t + e, shape=(t, v)),
                  Op("mul", 1, 3 * e)]


def head_backward(x: Shard) -> list[Op]:
    t, h, v, e = x.t, x.h, x.v, x.e
    ops = [Op("mul.backward", 1, 4 * e), Op("cross_entropy.backward", 3 * t * v, 2 * e * t * v, shape=(t, v)),
           _done(_matmul_backward(t, h, v, e), h * v)]
    if x.tp > 1:
        ops.append(_all_reduce(e * t * h))
    return ops + [_norm_backward(x)]


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
    2 norm statistics, plus the attention probabilities (``pairs``). Without biases each biased output is
    kept once instead of twice (``8 h``, ``3 hq``, ``3 f``); grouped-query attention keeps its narrower
    keys and values (``kv`` wide) and their copies repeated to every query head (``2 hq``); SwiGLU keeps
    ``7 f`` (gate and up with their biases, the SiLU's input and output, the product), ``5 f`` without biases.
    Under tensor parallelism the embedding also keeps its masked rows and their sum (``2 t h + t``), and the
    vocabulary-parallel loss keeps its probabilities once (``t v``) instead of the logits and their softmax
    (``2 t v``).
    """
    t, h, s, e = x.t, x.h, x.s, x.e
    embed = e * (2 * t * h + s * h) + 8 * (t + s)
    projections = 2 if x.bias else 1  # a projection's output, and its sum with the bias
    attention = (3 if x.heads_copied else 2) * x.hq  # its output, the output saved, the heads merged (unless a view)
    mlp = (7 if x.bias else 5) if x.mlp == "swiglu" else (4 if x.bias else 3)
    per_token = ((8 + 2 * x.bias) * h + projections * (x.hq + 2 * x.kv) + (2 * x.hq if x.gqa else 0) + attention
                 + mlp * x.f + 2)
    block = e * (t * per_token + x.pairs)
    if x.gqa:  # the offsets of the two concatenations that repeat keys and values
        block += 8 * 2 * (x.heads // x.kv_heads + 1)
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
