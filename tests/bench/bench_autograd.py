"""One GPT training step (forward + backward + AdamW) in minidist, and the same model in PyTorch on CPU.

Model: d_model 256, 4 layers, 4 heads, seq 128, batch 8, the shipped character vocabulary,
float32. Both frameworks start from the same weights (copied from minidist, Linear weights
transposed to PyTorch's (out, in) layout), so the first losses must agree: a cross-check of the
whole forward pass. Times are medians over several steps after warmup. Target: ratio <= 1.5.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

from minidist import data, nn, optim

CFG = dict(d_model=256, n_layers=4, n_heads=4, seq_len=128, dtype="float32")
BATCH, WARMUP, STEPS = 8, 2, 7


def numpy_threads() -> int:
    try:
        from threadpoolctl import threadpool_info

        return max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")
    except Exception:
        return int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))


def time_steps(step, n_warmup: int, n: int) -> tuple[float, list[float]]:
    losses = []
    for _ in range(n_warmup):
        losses.append(step())
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t0)
    return statistics.median(times), losses


def minidist_step_fn(model, x, y):
    opt = optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)

    def step():
        opt.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        return float(loss.data)

    return step


def torch_model(model, torch):
    """The same architecture in PyTorch, holding a copy of ``model``'s weights."""
    tnn, tF = torch.nn, torch.nn.functional
    c = model.config

    class Block(tnn.Module):
        def __init__(self):
            super().__init__()
            d = c.d_model
            self.ln1, self.ln2 = tnn.LayerNorm(d), tnn.LayerNorm(d)
            self.wq, self.wk, self.wv, self.wo = (tnn.Linear(d, d) for _ in range(4))
            self.fc1, self.fc2 = tnn.Linear(d, c.d_ff), tnn.Linear(c.d_ff, d)

        def forward(self, x):
            B, T, d = x.shape
            h = self.ln1(x)
            q, k, v = (w(h).view(B, T, c.n_heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
            a = tF.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d)
            x = x + self.wo(a)
            return x + self.fc2(tF.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class GPT(tnn.Module):
        def __init__(self):
            super().__init__()
            self.wte = tnn.Embedding(c.vocab_size, c.d_model)
            self.wpe = tnn.Embedding(c.seq_len, c.d_model)
            self.blocks = tnn.ModuleList(Block() for _ in range(c.n_layers))
            self.ln_f = tnn.LayerNorm(c.d_model)
            self.lm_head = tnn.Linear(c.d_model, c.vocab_size, bias=False)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for b in self.blocks:
                x = b(x)
            logits = self.lm_head(self.ln_f(x))
            return tF.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    tm = GPT()
    ours = model.state_dict()
    with torch.no_grad():
        for name, p in tm.named_parameters():
            src = ours[name.replace("fc1", "mlp.fc1").replace("fc2", "mlp.fc2")
                       .replace(".wq", ".attn.wq").replace(".wk", ".attn.wk").replace(".wv", ".attn.wv")
                       .replace(".wo", ".attn.wo")]
            is_linear_weight = name.endswith("weight") and src.ndim == 2 and not name.startswith(("wte", "wpe"))
            p.copy_(torch.from_numpy(src.T.copy() if is_linear_weight else src))
    return tm


def main() -> None:
    tokens, tok = data.load_tokens()
    cfg = nn.GPTConfig(vocab_size=tok.vocab_size, **CFG)
    model = nn.GPT(cfg, seed=0)
    x, y = data.get_batch(tokens, BATCH, cfg.seq_len, np.random.default_rng(0))
    threads = numpy_threads()
    print(f"GPT d_model={cfg.d_model} layers={cfg.n_layers} heads={cfg.n_heads} seq={cfg.seq_len} batch={BATCH} "
          f"vocab={cfg.vocab_size} params={model.num_parameters():,} float32, numpy threads={threads}")
    first_loss = float(model(x, y)[1].data)
    md_time, md_losses = time_steps(minidist_step_fn(model, x, y), WARMUP, STEPS)
    print(f"minidist: {md_time * 1e3:8.1f} ms/step (median of {STEPS}), losses {md_losses[0]:.4f} -> "
          f"{md_losses[-1]:.4f}")
    try:
        import torch
    except ImportError:
        print("torch not installed: no PyTorch ratio")
        return
    torch.set_num_threads(threads)
    tm = torch_model(nn.GPT(cfg, seed=0), torch)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    with torch.no_grad():
        torch_first = float(tm(xt, yt))
    print(f"first loss: minidist {first_loss:.6f}, torch {torch_first:.6f} (same weights; |diff| "
          f"{abs(first_loss - torch_first):.1e})")
    topt = torch.optim.AdamW(tm.parameters(), lr=1e-3, weight_decay=0.1)

    def tstep():
        topt.zero_grad()
        loss = tm(xt, yt)
        loss.backward()
        topt.step()
        return float(loss)

    t_time, t_losses = time_steps(tstep, WARMUP, STEPS)
    print(f"torch {torch.__version__}: {t_time * 1e3:8.1f} ms/step (median of {STEPS}, {torch.get_num_threads()} "
          f"threads), losses {t_losses[0]:.4f} -> {t_losses[-1]:.4f}")
    ratio = md_time / t_time
    print(f"ratio minidist / torch = {ratio:.2f}  (target <= 1.5: {'met' if ratio <= 1.5 else 'NOT met'})")


if __name__ == "__main__":
    main()
