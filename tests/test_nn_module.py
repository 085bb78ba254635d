"""Module bookkeeping: registration order, names, state_dict, modes, dtype, deterministic init."""

import numpy as np
import pytest

from minidist import nn


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(3, 4, rng=1)
        self.scale = nn.Parameter(np.ones(4, dtype=np.float32))
        self.layers = nn.ModuleList([nn.LayerNorm(4), nn.Linear(4, 2, bias=False, rng=2)])

    def forward(self, x):
        x = self.first(x) * self.scale
        for m in self.layers:
            x = m(x)
        return x


def test_names_follow_registration_order():
    m = Two()
    assert [n for n, _ in m.named_parameters()] == [
        "scale", "first.weight", "first.bias", "layers.0.weight", "layers.0.bias", "layers.1.weight"]
    assert m.num_parameters() == 4 + 12 + 4 + 4 + 4 + 8
    assert [type(c).__name__ for c in m.modules()] == ["Two", "Linear", "ModuleList", "LayerNorm", "Linear"]
    assert len(m.layers) == 2 and isinstance(m.layers[1], nn.Linear)
    assert all(p.requires_grad for p in m.parameters())


def test_reassignment_and_deletion_update_the_registry():
    m = Two()
    m.scale = None
    assert "scale" not in dict(m.named_parameters())
    del m.first
    assert not any(n.startswith("first.") for n, _ in m.named_parameters())


def test_forgetting_super_init_is_a_clear_error():
    class Bad(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(np.zeros(2))

    with pytest.raises(AttributeError, match="super"):
        Bad()


def test_state_dict_round_trip_copies():
    a, b = Two(), Two()
    for p in b.parameters():
        p.data[...] = 7.0
    sd = a.state_dict()
    b.load_state_dict(sd)
    for (na, pa), (nb_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb_
        np.testing.assert_array_equal(pa.data, pb.data)
    sd["first.weight"][...] = 99.0  # the state dict is a copy of the weights, and loading copies too
    assert not np.any(a.first.weight.data == 99.0) and not np.any(b.first.weight.data == 99.0)


def test_load_state_dict_errors():
    m = Two()
    sd = m.state_dict()
    extra = dict(sd, bogus=np.zeros(1))
    with pytest.raises(KeyError, match="bogus"):
        m.load_state_dict(extra)
    m.load_state_dict(extra, strict=False)
    partial = {k: v for k, v in sd.items() if k != "scale"}
    with pytest.raises(KeyError, match="scale"):
        m.load_state_dict(partial)
    with pytest.raises(ValueError, match=r"first.weight.*\(4, 3\)"):
        m.load_state_dict(dict(sd, **{"first.weight": np.zeros((4, 3))}))


def test_train_eval_zero_grad_and_to():
    m = Two()
    assert all(x.training for x in m.modules())
    m.eval()
    assert not any(x.training for x in m.modules())
    m.train()
    assert m.layers[0].training
    for p in m.parameters():
        p.grad = np.ones_like(p.data)
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())
    ref = m.first.weight.data.copy()
    assert m.to(np.float64) is m
    assert all(p.data.dtype == np.float64 for p in m.parameters())
    np.testing.assert_array_equal(m.first.weight.data, ref.astype(np.float64))


def test_float32_weights_are_the_rounded_float64_weights():
    a = nn.Linear(8, 8, rng=5, dtype="float32")
    b = nn.Linear(8, 8, rng=5, dtype="float64")
    np.testing.assert_array_equal(a.weight.data, b.weight.data.astype(np.float32))


def test_as_rng_never_uses_global_state():
    np.random.seed(123)
    x = nn.Linear(4, 4).weight.data.copy()
    np.random.seed(456)
    np.testing.assert_array_equal(nn.Linear(4, 4).weight.data, x)
    g = np.random.default_rng(9)
    assert nn.as_rng(g) is g
