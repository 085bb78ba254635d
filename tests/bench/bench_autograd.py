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
BATCH, ROUNDS, PER_ROUND = 8, 3, 4


def numpy_threads() -> int:
    """The threads numpy's BLAS really uses (PyTorch gets as many): asked of the library, where it can be.

    The environment alone misleads: with ``OPENBLAS_NUM_THREADS=1`` set, numpy ran on one thread
    while this said two and gave PyTorch two, and the ratio read 1.66 instead of about 1.1."""
    try:
        from threadpoolctl import threadpool_info

        return max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")
    except Exception:
        pass
    try:  # numpy's own OpenBLAS (Linux wheels), asked directly
        import ctypes

        with open("/proc/self/maps") as f:
            libs = sorted({line.split()[-1] for line in f if "openblas" in line.lower() and ".so" in line})
        for path in libs:
            lib = ctypes.CDLL(path)
            for name in ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
                         "openblas_get_num_threads64_", "openblas_get_num_threads"):
                if hasattr(lib, name):
                    return int(getattr(lib, name)())
    except OSError:
        pass
    for var in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # OpenBLAS's order
        if os.environ.get(var, "").isdigit() and int(os.environ[var]) > 0:
            return min(int(os.environ[var]), os.cpu_count() or 1)
    return os.cpu_count() or 1


def time_in_rounds(steps: dict, rounds: int, per_round: int) -> dict[str, tuple[float, list[float]]]:
    """Median seconds per step of each function, run in alternating blocks of ``per_round`` steps.

    Alternating blocks let both frameworks see the same machine load (the machine is shared), and
    blocks rather than single steps keep one library's spinning worker threads from slowing the
    other; the first step of each block only warms up and is not timed.
    """
    times: dict[str, list[float]] = {k: [] for k in steps}
    losses: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            for j in range(per_round):
                t0 = time.perf_counter()
                losses[name].append(step())
                if j > 0:
                    times[name].append(time.perf_counter() - t0)
    return {k: (statistics.median(times[k]), losses[k]) for k in steps}


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
            return tF.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))

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
    steps = {"minidist": minidist_step_fn(model, x, y)}
    try:
        import torch
    except ImportError:
        torch = None
        print("torch not installed: no PyTorch ratio")
    if torch is not None:
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
            return loss.item()

        steps["torch"] = tstep
    res = time_in_rounds(steps, ROUNDS, PER_ROUND)
    for name, (t, losses) in res.items():
        n = ROUNDS * (PER_ROUND - 1)
        print(f"{name:>8}: {t * 1e3:8.1f} ms/step (median of {n}), losses {losses[0]:.4f} -> {losses[-1]:.4f}")
    if torch is not None:
        ratio = res["minidist"][0] / res["torch"][0]
        print(f"torch {torch.__version__} with {torch.get_num_threads()} threads; ratio minidist / torch = "
              f"{ratio:.2f}  (target <= 1.5: {'met' if ratio <= 1.5 else 'NOT met'})")


if __name__ == "__main__":
    main()
