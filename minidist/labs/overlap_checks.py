"""Checks for lab 22, overlap and architecture-aware efficiency (book chapters 31 and 31a): the time of a ring
decomposed under its matmuls, against the simulated clock's rule, on the ideal device and on a measured one whose
host issues each product; the bytes of a key-value cache, against ``md.nn.kv_cache_bytes``; and DualPipeV's
bubble. Every case is drawn here, none is printed by the lab."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from minidist.labs.check import attempt, check_cases, fail, number, numbers_of, passed


def _ring(matmul: list[float], message: list[float], gather: bool) -> float:
    """The decomposed ring of ``md.parallel.all_gather_matmul`` (``gather``) or ``matmul_reduce_scatter``: each
    step lasts as long as the longer of its product and the message that runs under it. An all-gather step sends
    the shard it multiplies; a reduce-scatter step receives the running sum the previous step computed."""
    t, clock = len(matmul), 0.0
    for s in range(t):
        under = message[s] if gather and s < t - 1 else message[s - 1] if not gather and s > 0 else 0.0
        clock += max(matmul[s], under)
    return clock


def _ring_slips(mm: list[float], msg: list[float], gather: bool) -> dict[str, float]:
    """What the usual wrong models of the ring give, each with the idea it misses."""
    return {
        "that is the time without overlap: a step's message and product run one after the other":
            sum(mm) + sum(msg),
        "the steps are chained: a step starts only when both the previous product and the previous message are "
        "done, so the two streams cannot run ahead of each other": max(sum(mm), sum(msg)),
        "the two kinds of ring pair the messages with different products: in the all-gather a step sends the "
        "shard it is multiplying, in the reduce-scatter a message carries the sum the previous step computed":
            _ring(mm, msg, not gather),
        "one step of the ring has no message under it: there are t products but only t - 1 messages":
            len(mm) * max(max(mm), max(msg)),
    }


def check_ring_matmul_time(fn: Callable[[list[float], list[float], bool], float]) -> None:
    """``fn(matmul, message, gather)``: seconds of a decomposed ring of ``t = len(matmul)`` steps, ``matmul[s]`` the
    product of step ``s`` and ``message[s]`` the ``s``-th of the ``t - 1`` messages; ``gather``: an all-gather
    followed by the matmul (True) or a matmul followed by a reduce-scatter (False)."""
    rng = np.random.default_rng(2231)
    trials = [([2.0], [], True), ([3.0], [], False), ([1.0, 1.0], [5.0], True)]
    for _ in range(16):
        t = int(rng.integers(2, 9))
        mm = [float(x) for x in rng.uniform(0.2, 3.0, t).round(2)]
        msg = [float(x) for x in rng.uniform(0.2, 3.0, t - 1).round(2)]
        trials.append((mm, msg, bool(rng.integers(2))))
    for mm, msg, gather in trials:
        shown = f"ring_matmul_time({mm}, {msg}, gather={gather})"
        want = _ring(mm, msg, gather)
        got = number(shown, attempt("ring_matmul_time", fn, list(mm), list(msg), gather, shown=shown))
        if not math.isclose(got, want, rel_tol=1e-9):
            hint = next((h for h, v in _ring_slips(mm, msg, gather).items()
                         if math.isclose(got, v, rel_tol=1e-9) and not math.isclose(v, want, rel_tol=1e-9)), None)
            fail(f"{shown} is wrong", want, got, hint or "walk the steps in order: when can each step start, and "
                 "what runs beside its product?")
    passed(f"ring_matmul_time: {len(trials)} rings, all-gather and reduce-scatter")


def _on_gpu(whole: float, piece: float, message: float, host: float, t: int, host_ahead: bool = True,
            host_for_each: bool = True, send_first: bool = True, last_message: bool = False,
            plain_overlaps_host: bool = True) -> tuple[float, float]:
    """(plain, decomposed) all-gather + matmul on a measured device, from a start where the GPU and the host are
    both idle: the host needs ``host`` seconds to issue each product (the clock charges it for kernels only, not
    for the collectives' calls) and a product starts once the GPU is free and the host has issued it. The switches
    turn off one idea each, for the hints."""
    plain = (max((t - 1) * message, host) if plain_overlaps_host else (t - 1) * message + host) + whole
    clock = issued = 0.0
    for s in range(t):
        if host_ahead:
            issued = issued + host if host_for_each or s == 0 else issued
        else:  # the host waits for the GPU before issuing the next product
            issued = clock + host
        begin = max(clock, issued)
        sent = clock if send_first else begin  # the shard leaves as the step begins, before its product starts
        end = begin + piece
        clock = max(end, sent + message) if s < t - 1 or last_message else end
    return plain, clock


def check_ring_on_gpu(fn: Callable[[float, float, float, float, int], tuple]) -> None:
    """``fn(whole, piece, message, host, t) -> (plain, decomposed)``: seconds of the all-gather followed by one
    product (GPU seconds ``whole``) and of the decomposed ring of ``t`` products (``piece`` each) under
    ``t - 1`` messages, on a device whose host needs ``host`` seconds to issue each product, from a start where
    the GPU and the host are both idle."""
    rng = np.random.default_rng(2234)
    trials = [(10.0, 4.0, 2.0, 0.0, 4), (10.0, 4.0, 1.0, 30.0, 3), (6.0, 6.0, 0.0, 3.0, 1)]
    for k in range(18):
        t = int(rng.integers(2, 9))
        piece = round(float(rng.uniform(1, 60)), 2)
        whole = round(piece * float(rng.uniform(1, t)), 2)
        host = 0.0 if k % 6 == 0 else round(float(rng.uniform(1, 40)), 2)
        trials.append((whole, piece, round(float(rng.uniform(0.5, 60)), 2), host, t))
    names = ("plain", "decomposed")
    wrong = {
        "the GPU cannot start a product before the host has issued it: the host, idle at the start, issues the "
        "products one after another, `host` seconds each": dict(host=0.0),
        "the host does not wait for the GPU: it issues the next product while the current one runs, so the s-th "
        "product (counting from 1) is issued at s x host": dict(host_ahead=False),
        "every piece is a kernel of its own: the host issues each of the t products, not one":
            dict(host_for_each=False),
        "the shard leaves as its step begins, before the host has issued the product (the clock charges the host "
        "for the products only)": dict(send_first=False),
        "the last step sends nothing: there are t products but t - 1 messages": dict(last_message=True),
        "the host issues the plain product while the all-gather runs: the product starts at the later of the "
        "gather's end and its issue": dict(plain_overlaps_host=False),
    }
    def variant(kw: dict, whole, piece, message, host, t) -> tuple[float, float]:
        return _on_gpu(whole, piece, message, kw.get("host", host), t,
                       **{k: v for k, v in kw.items() if k != "host"})

    answers = []  # every trial's answer first: a slip is named by the variant that explains all of them
    for whole, piece, message, host, t in trials:
        shown = f"ring_on_gpu(whole={whole}, piece={piece}, message={message}, host={host}, t={t})"
        answers.append(numbers_of(shown, attempt("ring_on_gpu", fn, whole, piece, message, host, t, shown=shown),
                                  names))
    for args, got in zip(trials, answers):
        want = _on_gpu(*args)
        if all(math.isclose(g, w, rel_tol=1e-9) for g, w in zip(got, want)):
            continue
        whole, piece, message, host, t = args
        shown = f"ring_on_gpu(whole={whole}, piece={piece}, message={message}, host={host}, t={t})"
        if all(math.isclose(g, w, rel_tol=1e-9) for g, w in zip(got, want[::-1])):
            fail(f"{shown} is wrong", want, tuple(got), "return (plain, decomposed), in that order")
        which = 0 if not math.isclose(got[0], want[0], rel_tol=1e-9) else 1

        def explains(kw: dict, cases) -> bool:
            return all(math.isclose(a[which], variant(kw, *c)[which], rel_tol=1e-9) for c, a in cases)

        here = [h for h, kw in wrong.items() if explains(kw, [(args, got)])
                and not math.isclose(variant(kw, *args)[which], want[which], rel_tol=1e-9)]
        everywhere = [h for h in here if explains(wrong[h], list(zip(trials, answers)))]
        hint = (everywhere or here or [None])[0]
        fail(f"{shown}: {names[which]} is wrong", want[which], got[which],
             hint or ("the plain version gathers, then runs one product; the ring's step s starts when step s - 1 "
                      "has finished both its product and its message, and its product waits for the host"))
    passed(f"ring_on_gpu: {len(trials)} rings, host-bound, message-bound and product-bound")


def _configs(rng: np.random.Generator) -> list[tuple]:
    """GPTConfigs of every kind the lab names (MHA, GQA, MQA, MLA, windows, and mixes), none of the lab's."""
    from minidist.nn import GPTConfig

    out = []
    for k in range(18):
        heads = int(rng.choice([4, 8, 16]))
        head_dim = int(rng.choice([8, 16, 32]))
        kind = k % 6
        kv = heads if kind in (0, 4) else int(rng.choice([h for h in (1, 2, 4) if heads % h == 0]))
        latent = int(rng.choice([12, 24, 40])) if kind in (3, 5) else None
        if latent is not None:
            kv = heads  # latent attention rebuilds every head's keys and values
        window = int(rng.integers(4, 40)) if kind in (4, 5) or rng.random() < 0.2 else None
        cfg = GPTConfig(vocab_size=32, seq_len=64, d_model=heads * head_dim, n_layers=int(rng.integers(1, 7)),
                        n_heads=heads, n_kv_heads=kv, kv_latent=latent, window=window)
        out.append((cfg, int(rng.integers(1, 80)), int(rng.choice([1, 2, 4]))))
    return out


def check_kv_cache_bytes(fn: Callable[[object, int, int], int]) -> None:
    """``fn(cfg, tokens, itemsize)``: bytes one sequence's key-value cache holds after ``tokens`` tokens, every
    layer together, ``itemsize`` bytes per number; against ``md.nn.kv_cache_bytes``."""
    from minidist.nn import kv_cache_bytes

    for cfg, tokens, itemsize in _configs(np.random.default_rng(2232)):
        desc = (f"n_layers={cfg.n_layers}, n_heads={cfg.n_heads}, n_kv_heads={cfg.n_kv_heads}, head_dim="
                f"{cfg.head_dim}, kv_latent={cfg.kv_latent}, window={cfg.window}")
        shown = f"kv_cache_bytes(GPTConfig({desc}), tokens={tokens}, itemsize={itemsize})"
        want = kv_cache_bytes(cfg, 1, tokens, itemsize)
        got = number(shown, attempt("kv_cache_bytes", fn, cfg, tokens, itemsize, shown=shown))
        if got != want:
            kept = tokens if cfg.window is None else min(tokens, cfg.window)
            per = want // max(1, cfg.n_layers * kept * itemsize)
            latent = cfg.kv_latent is not None
            if cfg.window is not None and tokens > cfg.window and math.isclose(got, want * tokens / cfg.window):
                hint = "a sliding window keeps only the last window tokens: the cache stops growing there"
            elif math.isclose(got, want / cfg.n_layers) and cfg.n_layers > 1:
                hint = "every layer keeps its own cache"
            elif math.isclose(got, want / itemsize) and itemsize > 1:
                hint = "the question asks for bytes: count itemsize bytes per number"
            elif not latent and math.isclose(got, want * cfg.n_heads / cfg.n_kv_heads) and cfg.n_kv_heads < cfg.n_heads:
                hint = "grouped query heads share their keys and values: count the key-value heads"
            elif not latent and math.isclose(got, want / 2):
                hint = "both the keys and the values are cached"
            elif latent and not math.isclose(got, want):
                hint = ("latent attention caches only its latent per token and layer; the keys and values are "
                        "rebuilt from it")
            else:
                hint = f"count the numbers one layer keeps per token ({per} here), the tokens kept, the layers"
            fail(f"{shown} is wrong", want, got, hint)
    passed("kv_cache_bytes: 18 models: MHA, GQA, MQA, MLA and windows")


def check_dualpipev_bubble(fn: Callable[[int, int], float]) -> None:
    """``fn(p, m)``: the idle share of DualPipeV's span with equal F, I and W costs."""
    rng = np.random.default_rng(2233)
    pairs = [(2, 1), (3, 5)] + [(int(rng.integers(2, 17)), int(rng.integers(1, 65))) for _ in range(8)]
    pairs = [(p, m) for p, m in pairs if (p, m) != (4, 8)]  # the lab's own case is measured, not graded
    cases = [((p, m), (p - 1) / (6 * m + p - 1), "each rank does 3 m stage-times of work (F, I, W per micro-batch) "
              "and idles while the V fills and drains, in pieces half a stage long") for p, m in pairs]

    def diagnose(args, expected, got):
        p, m = args
        if math.isclose(got, (p - 1) / (3 * m + p - 1)):
            return "that is zero bubble's: on the V each chunk is half a stage, so the fill and drain take half as long"
        if math.isclose(got, (p - 1) / (6 * m)) or math.isclose(got, (p - 1) / (3 * m) / 2):
            return "that is idle time over work; the question asks for the idle share of the whole span"
        return None

    check_cases("dualpipev_bubble", fn, cases, rel=1e-12, diagnose=diagnose)
