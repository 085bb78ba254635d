"""Core autograd: every primitive op against central differences, the engine's guarantees, errors,
dtype rules and cost reporting."""

import sys

import numpy as np
import pytest

import minidist as md
from minidist.autograd import cost
from tests.gradcheck import gradcheck

rng = np.random.default_rng(1234)


def leaf(*shape, positive=False, low=None):
    d = rng.standard_normal(shape)
    if positive:
        d = np.abs(d) + 0.5
    return md.tensor(d, requires_grad=True)


# ---------------------------------------------------------------------------- gradient checks
BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "pow": lambda a, b: a ** b,
}
BROADCAST_PAIRS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 3, 4), (3, 1)), ((1, 4), (3, 1)), ((), (2, 3)),
                   ((2, 1, 4), (1, 3, 1))]


@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("shapes", BROADCAST_PAIRS, ids=str)
def test_binary_ops_gradcheck_with_broadcasting(name, shapes):
    a = leaf(*shapes[0], positive=True)
    b = leaf(*shapes[1], positive=True)
    gradcheck(BINARY[name], a, b)


@pytest.mark.parametrize("f", [lambda a: a + 2.5, lambda a: 2.5 - a, lambda a: a * 3, lambda a: 3 / a,
                               lambda a: a / 4, lambda a: a ** 3, lambda a: a ** 2, lambda a: a ** 0.5,
                               lambda a: 2.0 ** a, lambda a: -a, lambda a: a - np.float64(1.5),
                               lambda a: np.ones((2, 3)) * a, lambda a: a @ np.ones((3, 2))],
                         ids=["radd", "rsub", "mul_scalar", "rdiv", "div_scalar", "pow3", "pow2", "sqrt_pow",
                              "rpow", "neg", "sub_np_scalar", "rmul_ndarray", "matmul_ndarray"])
def test_ops_with_constants_gradcheck(f):
    gradcheck(f, leaf(2, 3, positive=True))


UNARY = {
    "exp": lambda a: a.exp(), "log": lambda a: a.log(), "sqrt": lambda a: a.sqrt(), "tanh": lambda a: a.tanh(),
    "relu": lambda a: a.relu(), "sigmoid": lambda a: a.sigmoid(), "abs": lambda a: a.abs(),
    "gelu": lambda a: a.gelu(), "silu": lambda a: a.silu(), "softmax": lambda a: a.softmax(),
    "softmax0": lambda a: a.softmax(axis=0), "log_softmax": lambda a: a.log_softmax(),
    "clip": lambda a: a.clip(-0.5, 0.7), "astype": lambda a: a.astype(np.float64) * 2,
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_ops_gradcheck(name):
    positive = name in ("log", "sqrt")
    x = leaf(3, 5, positive=positive)
    if name in ("relu", "abs", "clip"):  # keep away from the kinks where the derivative jumps
        x.data[np.abs(x.data) < 1e-3] = 0.1
        x.data[np.abs(x.data - 0.7) < 1e-3] = 0.2
        x.data[np.abs(x.data + 0.5) < 1e-3] = 0.2
    gradcheck(UNARY[name], x)


REDUCTIONS = [(f, axis, keep) for f in ("sum", "mean", "max", "min", "var")
              for axis in (None, 0, -1, (0, 2)) for keep in (False, True)]


@pytest.mark.parametrize("name,axis,keepdims", REDUCTIONS)
def test_reductions_gradcheck(name, axis, keepdims):
    x = leaf(2, 3, 4)
    gradcheck(lambda a: getattr(a, name)(axis=axis, keepdims=keepdims), x)


def test_var_ddof_and_values():
    x = leaf(4, 5)
    np.testing.assert_allclose(x.var(axis=1, ddof=1).data, x.data.var(axis=1, ddof=1))
    gradcheck(lambda a: a.var(axis=0, ddof=1), x)


def test_max_ties_split_the_gradient():
    x = md.tensor([1.0, 3.0, 3.0], requires_grad=True)
    x.max().backward()
    np.testing.assert_allclose(x.grad, [0, 0.5, 0.5])


@pytest.mark.parametrize("sa,sb", [((4, 3), (3, 5)), ((2, 4, 3), (3, 5)), ((2, 4, 3), (2, 3, 5)),
                                   ((2, 1, 4, 3), (3, 3, 5)), ((3,), (3, 5)), ((4, 3), (3,)), ((3,), (3,)),
                                   ((3,), (2, 3, 5)), ((2, 4, 3), (3,)), ((4, 3), (2, 3, 5))], ids=str)
def test_matmul_gradcheck(sa, sb):
    gradcheck(lambda a, b: a @ b, leaf(*sa), leaf(*sb))
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    np.testing.assert_allclose((md.tensor(a) @ md.tensor(b)).data, a @ b)


@pytest.mark.parametrize("f", [
    lambda a: a.reshape(6, 4), lambda a: a.reshape((4, -1)), lambda a: a.view(2, 12), lambda a: a.transpose(),
    lambda a: a.transpose(1, 0, 2), lambda a: a.T, lambda a: a.permute(2, 0, 1), lambda a: a.swapaxes(0, 2),
    lambda a: a.unsqueeze(1), lambda a: a[:, :1].squeeze(1), lambda a: a.flatten(1),
    lambda a: a[1], lambda a: a[:, 1:3], lambda a: a[..., ::2], lambda a: a[None, 0, :, -1],
    lambda a: a[np.array([0, 1, 1, 0])], lambda a: a[:, [2, 2, 0]], lambda a: a[a.data > 0],
    lambda a: a[md.tensor(np.array([1, 1]))], lambda a: a[np.array([0, 1]), np.array([2, 2])],
], ids=["reshape", "reshape_tuple", "view", "transpose", "transpose_axes", "T", "permute", "swapaxes", "unsqueeze",
        "squeeze", "flatten", "int", "slice", "step", "none_mixed", "int_array_repeats", "list_repeats", "bool_mask",
        "tensor_index", "two_arrays"])
def test_shape_and_indexing_gradcheck(f):
    gradcheck(f, leaf(2, 3, 4))


def test_repeated_index_accumulates():
    x = md.tensor(np.zeros(3), requires_grad=True)
    x[np.array([0, 0, 0, 2])].sum().backward()
    np.testing.assert_array_equal(x.grad, [3, 0, 1])


def test_forward_values_match_numpy():
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4,))
    ta, tb = md.tensor(a), md.tensor(b)
    for got, want in [(ta + tb, a + b), (ta * tb, a * b), (ta / tb, a / b), (ta - tb, a - b), ((ta * ta).sqrt(),
                      np.abs(a)), (ta.exp(), np.exp(a)), (ta.tanh(), np.tanh(a)), (ta.sum(0), a.sum(0)),
                      (ta.mean(), a.mean()), (ta.max(1), a.max(1)), (ta.T, a.T), (ta[1:, ::2], a[1:, ::2])]:
        np.testing.assert_allclose(got.data, want, rtol=1e-12)


# ---------------------------------------------------------------------------- engine guarantees
def test_long_chain_does_not_hit_recursion_limit():
    n = 10_000
    assert n > sys.getrecursionlimit()
    x = md.tensor(np.array([1.0]), requires_grad=True)
    y = x
    for _ in range(n):
        y = y * 1.0001
    y.sum().backward()
    np.testing.assert_allclose(x.grad, [1.0001 ** n], rtol=1e-10)


def test_node_reused_many_times_gets_summed_gradient():
    x = md.tensor(np.array([2.0, -1.0]), requires_grad=True)
    h = x * 3.0  # an intermediate node, used 100 times
    total = h
    for _ in range(99):
        total = total + h
    total.sum().backward()
    np.testing.assert_allclose(x.grad, [300.0, 300.0])


def test_same_tensor_twice_in_one_op():
    x = md.tensor(np.array([3.0]), requires_grad=True)
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad, [6.0])


def test_grad_accumulates_across_backward_calls():
    x = md.tensor(np.array([1.0, 2.0]), requires_grad=True)
    (x * x).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad, [2 + 3, 4 + 3])
    x.zero_grad()
    assert x.grad is None


def test_grad_buffers_are_not_shared_between_leaves():
    a = md.tensor(np.ones(2), requires_grad=True)
    b = md.tensor(np.ones(2), requires_grad=True)
    (a + b).sum().backward()
    (a * 5).sum().backward()  # in-place accumulation into a.grad must not leak into b.grad
    np.testing.assert_allclose(a.grad, [6, 6])
    np.testing.assert_allclose(b.grad, [1, 1])


def test_no_grad_builds_no_graph():
    x = md.tensor(np.ones(3), requires_grad=True)
    with md.no_grad():
        y = (x * 2).exp().sum()
        assert not md.is_grad_enabled()
        with md.enable_grad():
            z = x * 2
    assert md.is_grad_enabled()
    assert not y.requires_grad and y.is_leaf and y._parents == ()
    assert z.requires_grad

    @md.no_grad()
    def f(t):
        return t * 2

    assert not f(x).requires_grad

    @md.no_grad
    def g(t):
        return t * 2

    assert not g(x).requires_grad and md.is_grad_enabled()
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.backward()


def test_graph_freed_unless_retained():
    x = md.tensor(np.array([1.0, 2.0]), requires_grad=True)
    h = x.exp()
    y = h.sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad, 2 * np.exp([1.0, 2.0]))
    assert h._parents == ()  # intermediate graph released
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


def test_non_scalar_backward_needs_grad():
    x = md.tensor(np.ones((2, 2)), requires_grad=True)
    y = x * 2
    with pytest.raises(RuntimeError, match=r"scalar outputs.*\(2, 2\)"):
        y.backward()
    y.backward(np.ones((2, 2)))
    np.testing.assert_allclose(x.grad, 2 * np.ones((2, 2)))
    with pytest.raises(ValueError, match="shape"):
        (x * 2).backward(np.ones(3))


def test_leaf_backward_and_detach_and_retain_grad():
    x = md.tensor(np.array([1.0, 2.0]), requires_grad=True)
    x.backward(np.array([1.0, 1.0]))
    np.testing.assert_allclose(x.grad, [1, 1])
    d = x.detach()
    assert not d.requires_grad and d.data is x.data
    h = (x * 2).retain_grad()
    (h * h).sum().backward()
    np.testing.assert_allclose(h.grad, 2 * h.data)


def test_hooks_replace_gradient_and_post_accumulate_fires_in_reverse_layer_order():
    layers = [md.tensor(rng.standard_normal((4, 4)), requires_grad=True) for _ in range(3)]
    order = []
    for i, w in enumerate(layers):
        w.register_post_accumulate_grad_hook(lambda t, i=i: order.append((i, t.grad is not None)))
    x = md.tensor(rng.standard_normal((2, 4)))
    h = x
    for w in layers:
        h = (h @ w).tanh()
    seen = []
    h.register_hook(lambda g: seen.append(g.shape))
    handle = layers[0].register_hook(lambda g: g * 0)  # replace the first layer's gradient
    h.sum().backward()
    assert order == [(2, True), (1, True), (0, True)]
    assert seen == [(2, 4)]
    np.testing.assert_array_equal(layers[0].grad, 0)
    handle.remove()
    h2 = (x @ layers[0]).sum()
    h2.backward()
    assert np.abs(layers[0].grad).sum() > 0


def test_post_accumulate_hook_fires_before_backward_finishes():
    # w1 is used by the last op only; its hook must fire before the first layer's backward runs
    w0 = md.tensor(rng.standard_normal((3, 3)), requires_grad=True)
    w1 = md.tensor(rng.standard_normal((3, 3)), requires_grad=True)
    events = []

    class Spy(md.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.data.copy()

        @staticmethod
        def backward(ctx, g):
            events.append("first layer backward")
            return g

    w1.register_post_accumulate_grad_hook(lambda t: events.append("w1 ready"))
    x = md.tensor(rng.standard_normal((2, 3)), requires_grad=True)
    h = Spy.apply(x @ w0)
    (h @ w1).sum().backward()
    assert events == ["w1 ready", "first layer backward"]


# ---------------------------------------------------------------------------- errors and dtypes
def test_matmul_shape_error_names_both_shapes():
    with pytest.raises(ValueError, match=r"matmul: shapes \(4, 3\) and \(5, 2\) do not align: 3 != 5"):
        md.tensor(np.ones((4, 3))) @ md.tensor(np.ones((5, 2)))
    with pytest.raises(ValueError, match=r"matmul.*\(2, 4, 3\).*\(3, 3, 5\)"):
        md.tensor(np.ones((2, 4, 3))) @ md.tensor(np.ones((3, 3, 5)))


@pytest.mark.parametrize("op", ["add", "mul", "sub", "div"])
def test_broadcast_error_names_op_and_shapes(op):
    f = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "sub": lambda a, b: a - b,
         "div": lambda a, b: a / b}[op]
    with pytest.raises(ValueError, match=rf"{op}: shapes \(2, 3\) and \(4,\)"):
        f(md.tensor(np.ones((2, 3))), md.tensor(np.ones(4)))


def test_dtype_rules():
    x32 = md.tensor(np.ones(3, dtype=np.float32), requires_grad=True)
    assert (x32 * 0.5).dtype == np.float32
    assert (x32 + np.float64(2.0)).dtype == np.float32
    assert (x32 + np.array(2.0)).dtype == np.float32
    assert (2 ** x32).dtype == np.float32
    assert (x32 * np.array([1, 0, 1])).dtype == np.float32  # ints join the float dtype
    assert (x32.exp().sum()).dtype == np.float32
    x64 = md.tensor(np.ones(3))
    with pytest.raises(TypeError, match="mul.*float32.*float64"):
        x32 * x64
    with pytest.raises(TypeError, match="matmul.*float32.*float64"):
        x32 @ x64
    h = md.tensor(np.ones(3, dtype=np.float16), requires_grad=True)
    y = h.astype(np.float32) * x32
    y.sum().backward()
    assert h.grad.dtype == np.float16 and x32.grad.dtype == np.float32
    ids = md.tensor(np.array([1, 2, 3]))
    assert not ids.requires_grad and (ids * 2).dtype == ids.dtype
    with pytest.raises(TypeError):
        md.tensor(np.array([1, 2]), requires_grad=True)


def test_comparisons_are_not_differentiable():
    x = md.tensor(np.array([1.0, -1.0]), requires_grad=True)
    m = x > 0
    assert m.dtype == np.bool_ and not m.requires_grad
    np.testing.assert_array_equal((x == 1.0).data, [True, False])
    assert x in [x]  # identity hashing still works


def test_tensor_basics():
    t = md.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    assert t.shape == (2, 2) and t.ndim == 2 and t.size == 4 and len(t) == 2 and t.dtype == np.float64
    assert t.sum().item() == 10.0 and isinstance(t.numpy(), np.ndarray)
    assert "requires_grad=True" in repr(t) and "grad_fn=<mul>" in repr(t * 2)
    assert md.tensor([1, 2], dtype=np.float32).dtype == np.float32
    src = np.ones(2)
    assert md.tensor(src).data is not src and md.Tensor(src).data is src
    np.testing.assert_array_equal(np.asarray(t), t.data)
    np.testing.assert_array_equal((np.ones(2) + t).data, t.data + 1)  # numpy defers to Tensor


# ---------------------------------------------------------------------------- cost reporting
def test_matmul_reports_2mnk_and_backward_4mnk():
    m, k, n = 4, 3, 5
    log = []
    a = md.tensor(np.ones((m, k)), requires_grad=True)
    b = md.tensor(np.ones((k, n)), requires_grad=True)
    with cost.cost_hook(lambda name, flops, nbytes, dtype: log.append((name, flops, nbytes, dtype))):
        y = a @ b
        y.backward(np.ones((m, n)))
    by_name = {name: (flops, nbytes) for name, flops, nbytes, _ in log}
    assert by_name["matmul"][0] == 2 * m * n * k
    assert by_name["matmul"][1] == 8 * (m * k + k * n + m * n)
    assert by_name["matmul.backward"][0] == 4 * m * n * k
    assert by_name["matmul.backward"][1] == 2 * 8 * (m * k + k * n + m * n)
    log.clear()
    with cost.cost_hook(lambda name, flops, nbytes, dtype: log.append((name, flops, nbytes, dtype))):
        (md.tensor(np.ones((m, k))) @ b).backward(np.ones((m, n)))  # only b needs a gradient
    assert log[-1][:2] == ("matmul.backward", 2 * m * n * k)
    assert all(d == np.float64 for *_, d in log)


def test_every_op_reports_a_cost_and_nothing_without_hook():
    log = []
    x = md.tensor(rng.standard_normal((2, 3)), requires_grad=True)
    with cost.cost_hook(lambda *a: log.append(a[0])):
        y = (x.exp() * 2 + 1).tanh().sum()
        y.backward()
    assert log == ["exp", "mul", "add", "tanh", "sum", "sum.backward", "tanh.backward", "add.backward",
                   "mul.backward", "exp.backward"]
    log.clear()
    with cost.cost_hook(lambda *a: log.append(a[:3])):
        y = x.T.reshape(6)[np.array([0, 0, 5])]
        y.backward(np.ones(3))
        _ = x > 0
    names = [name for name, _, _ in log]
    assert names == ["transpose", "reshape", "getitem", "getitem.backward", "reshape.backward",
                     "transpose.backward", "gt"]
    assert log[0][2] == 0 and log[1][2] == 2 * 6 * 8  # a view moves nothing; reshaping x.T copies
    assert cost.get_cost_hook() is None


def test_gradcheck_catches_a_wrong_backward():
    class WrongSquare(md.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.data ** 2

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x * 2.001

    with pytest.raises(AssertionError):
        gradcheck(WrongSquare.apply, leaf(3))


def test_astype_gradient_is_cast_back_and_float16_works():
    x = md.tensor(rng.standard_normal(4), requires_grad=True)
    y = x.astype(np.float32)
    assert y.dtype == np.float32 and y.grad_fn == "astype" and x.astype(np.float64) is x
    (y * np.float32(3)).sum().backward()
    assert x.grad.dtype == np.float64
    np.testing.assert_array_equal(x.grad, 3.0)
    h = md.tensor(rng.standard_normal((3, 2)).astype(np.float16), requires_grad=True)
    out = (h @ h.T).relu().sum()
    out.backward()
    assert out.dtype == np.float16 and h.grad.dtype == np.float16 and h.grad.shape == (3, 2)


def test_non_shape_value_errors_are_not_reported_as_broadcasting():
    with pytest.raises(ValueError, match="negative integer powers"):
        md.tensor(np.array([2, 3])) ** -1


def test_leaf_grad_never_aliases_memory_someone_else_holds():
    x = md.tensor(np.ones((2, 3)), requires_grad=True)
    seed = np.ones(6)
    x.reshape(6).backward(seed)  # x.grad would be a view of the caller's array
    assert not np.shares_memory(x.grad, seed)
    x.reshape(6).backward(seed)
    np.testing.assert_array_equal(seed, 1)  # in-place accumulation did not write into it
    kept = []
    w = md.tensor(np.ones((3, 2)), requires_grad=True)
    w.register_hook(lambda g: kept.append(g))
    (md.tensor(np.ones((4, 3))) @ w).sum().backward()
    (md.tensor(np.ones((4, 3))) @ w).sum().backward()
    np.testing.assert_array_equal(kept[0], 4)  # the hook's array was not accumulated into
    np.testing.assert_array_equal(w.grad, 8)
