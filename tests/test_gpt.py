"""The GPT: config validation, forward against numpy, gradients, determinism across processes, generation."""

import hashlib
import subprocess
import sys

import numpy as np
import pytest

import minidist as md
from minidist import nn
from tests.test_nn import attention_ref, gelu_tanh, layer_norm, lin, numeric_gradcheck, rms_norm, silu


def tiny(**kw):
    base = dict(vocab_size=13, seq_len=8, d_model=8, n_layers=2, n_heads=2, dtype="float64")
    base.update(kw)
    return nn.GPTConfig(**base)


@pytest.mark.parametrize("kw,field", [
    (dict(d_model=10, n_heads=4), "n_heads"),
    (dict(n_heads=4, n_kv_heads=3), "n_kv_heads"),
    (dict(mlp="relu"), "mlp"),
    (dict(norm="batchnorm"), "norm"),
    (dict(n_layers=0), "n_layers"),
    (dict(dropout=1.0), "dropout"),
    (dict(dtype="int32"), "dtype"),
])
def test_config_validation_names_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        tiny(**kw)


def test_config_defaults():
    c = tiny(n_heads=4)
    assert c.n_kv_heads == 4 and c.d_ff == 32 and c.head_dim == 2
    s = tiny(mlp="swiglu", d_model=12, n_heads=4)
    assert s.d_ff == 32 and s.d_ff % 8 == 0


def gpt_reference(model, idx, targets):
    """The whole forward pass in plain numpy, reading the model's weights."""
    c = model.config
    B, T = idx.shape

    def norm(mod, v):
        return layer_norm(v, mod.weight.data, mod.bias.data) if c.norm == "layernorm" else rms_norm(v, mod.weight.data)

    x = model.wte.weight.data[idx] + model.wpe.weight.data[np.arange(T)]
    for b in model.blocks:
        x = x + attention_ref(b.attn, norm(b.ln1, x))
        h = norm(b.ln2, x)
        if c.mlp == "gelu":
            x = x + lin(b.mlp.fc2, gelu_tanh(lin(b.mlp.fc1, h)))
        else:
            x = x + lin(b.mlp.w_down, silu(lin(b.mlp.w_gate, h)) * lin(b.mlp.w_up, h))
    h = norm(model.ln_f, x)
    logits = h @ model.wte.weight.data.T if c.tie_embeddings else h @ model.lm_head.weight.data
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    loss = -np.take_along_axis(logp, targets[..., None], -1).mean()
    return logits, loss


@pytest.mark.parametrize("kw", [dict(), dict(mlp="swiglu", norm="rmsnorm", n_heads=4, n_kv_heads=2, bias=False),
                                dict(tie_embeddings=True)])
def test_gpt_forward_matches_numpy(kw):
    model = nn.GPT(tiny(**kw), seed=3)
    rng = np.random.default_rng(0)
    idx, tgt = rng.integers(0, 13, (2, 7)), rng.integers(0, 13, (2, 7))
    logits, loss = model(idx, tgt)
    ref_logits, ref_loss = gpt_reference(model, idx, tgt)
    assert logits.shape == (2, 7, 13)
    np.testing.assert_allclose(logits.data, ref_logits, rtol=1e-9, atol=1e-12)
    assert float(loss.data) == pytest.approx(ref_loss, rel=1e-10)
    assert model(idx)[1] is None
    assert abs(ref_loss - np.log(13)) < 0.5  # small init: close to uniform


def test_tied_embeddings_share_one_parameter():
    model = nn.GPT(tiny(tie_embeddings=True))
    untied = nn.GPT(tiny())
    names = [n for n, _ in model.named_parameters()]
    assert not any(n.startswith("lm_head") for n in names)
    assert untied.num_parameters() - model.num_parameters() == 13 * 8


@pytest.mark.parametrize("kw", [dict(), dict(mlp="swiglu", norm="rmsnorm", n_heads=4, n_kv_heads=2)])
def test_gpt_loss_gradients(kw):
    model = nn.GPT(tiny(**kw), seed=1)
    rng = np.random.default_rng(0)
    idx, tgt = rng.integers(0, 13, (2, 6)), rng.integers(0, 13, (2, 6))
    p = dict(model.named_parameters())
    picked = [p["wte.weight"], p["wpe.weight"], p["blocks.0.attn.wq.weight"], p["blocks.1.attn.wv.weight"],
              p["blocks.0.ln1.weight"], p["ln_f.weight"], p["lm_head.weight"],
              p["blocks.1.mlp.fc2.weight" if "gelu" == model.config.mlp else "blocks.1.mlp.w_gate.weight"]]
    numeric_gradcheck(lambda: model(idx, tgt)[1], picked, n_entries=3)
    # Every parameter receives a gradient.
    model.zero_grad()
    model(idx, tgt)[1].backward()
    assert all(q.grad is not None and q.grad.shape == q.shape for q in model.parameters())


def test_same_seed_same_bytes_in_another_process():
    def digest(model):
        h = hashlib.sha256()
        for name, a in model.state_dict().items():
            h.update(name.encode())
            h.update(a.tobytes())
        return h.hexdigest()

    cfg = dict(vocab_size=41, seq_len=16, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, mlp="swiglu")
    code = ("import hashlib, minidist.nn as nn\n"
            f"m = nn.GPT(nn.GPTConfig(**{cfg!r}), seed=7)\n"
            "h = hashlib.sha256()\n"
            "for n, a in m.state_dict().items():\n    h.update(n.encode()); h.update(a.tobytes())\n"
            "print(h.hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == digest(nn.GPT(nn.GPTConfig(**cfg), seed=7))
    assert out != digest(nn.GPT(nn.GPTConfig(**cfg), seed=8))
    # Dropout draws from its own stream: switching it on leaves the weights unchanged.
    assert out == digest(nn.GPT(nn.GPTConfig(**cfg, dropout=0.1), seed=7))


def test_dropout_only_in_training():
    model = nn.GPT(tiny(dropout=0.5), seed=0)
    idx = np.random.default_rng(0).integers(0, 13, (2, 8))
    model.eval()
    a, b = model(idx)[0].data, model(idx)[0].data
    np.testing.assert_array_equal(a, b)
    model.train()
    assert not np.allclose(model(idx)[0].data, a)


def test_input_errors():
    model = nn.GPT(tiny())
    with pytest.raises(ValueError, match="seq_len=8"):
        model(np.zeros((1, 9), dtype=np.int64))
    with pytest.raises(ValueError, match="batch, time"):
        model(np.zeros(4, dtype=np.int64))
    with pytest.raises(ValueError, match="targets"):
        model(np.zeros((1, 4), dtype=np.int64), np.zeros((1, 3), dtype=np.int64))


def test_generate():
    model = nn.GPT(tiny(), seed=0)
    start = np.array([[1, 2, 3]])
    out = model.generate(start, 12, temperature=1.0, rng=0)
    assert out.shape == (1, 15) and out.dtype == np.int64
    np.testing.assert_array_equal(out[:, :3], start)
    assert out.min() >= 0 and out.max() < 13
    np.testing.assert_array_equal(out, model.generate(start, 12, temperature=1.0, rng=0))
    greedy = model.generate(start, 3, temperature=0)
    with md.no_grad():
        logits, _ = model(start)
    assert greedy[0, 3] == int(np.argmax(logits.data[0, -1]))
    assert model.training  # the mode is restored
    top1 = model.generate(start, 3, temperature=1.0, rng=1, top_k=1)
    np.testing.assert_array_equal(top1, greedy)


def test_matmul_flops_are_2NP_forward_and_4NP_backward():
    # The 6 N P rule for training FLOPs (book ch. 6), read off the cost hook: every Linear weight
    # costs 2 flops per token forward and 4 backward (gradient of the input and of the weight).
    from minidist.autograd.cost import cost_hook

    model = nn.GPT(tiny(n_heads=4, n_kv_heads=2, mlp="swiglu"), seed=0)
    flops = {"matmul": 0.0, "matmul.backward": 0.0}

    def hook(name, f, nbytes, dtype):
        if name in flops:
            flops[name] += f

    idx = np.random.default_rng(0).integers(0, 13, (3, 8))
    with cost_hook(hook):
        model(idx, idx)[1].backward()
    p_linear = sum(m.weight.size for m in model.modules() if isinstance(m, nn.Linear))
    tokens = idx.size
    assert flops["matmul"] == 2 * tokens * p_linear
    assert flops["matmul.backward"] == 4 * tokens * p_linear


def test_model_survives_pickle_and_deepcopy():
    # launch() ships functions and their closures to rank processes by pickling.
    import copy
    import pickle

    model = nn.GPT(tiny(tie_embeddings=True), seed=2)
    idx = np.arange(8)[None] % 13
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        np.testing.assert_array_equal(clone(idx)[0].data, model(idx)[0].data)
        assert clone.lm_head.embedding is clone.wte
        assert clone.num_parameters() == model.num_parameters()
