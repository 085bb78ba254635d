"""Checks for lab 00, the sandbox: the cost of one message, and a shift around a ring of ranks."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from minidist import dist
from minidist.labs.check import CheckFailed, check_cases, passed
from minidist.labs.ranks import compare_ranks, run_ranks


def check_send_time(fn: Callable[[float, float, float], float]) -> None:
    """``fn(nbytes, alpha, beta)`` must be alpha + nbytes / beta (seconds; beta in bytes/s)."""
    nvlink, ib = (1e-6, 450e9), (2e-6, 50e9)
    cases = [((4096, *nvlink), 1e-6 + 4096 / 450e9, "a small message inside a node: mostly latency"),
             ((1e9, *ib), 2e-6 + 1e9 / 50e9, "1 GB over InfiniBand: mostly bandwidth (20 ms)"),
             ((0, *ib), 2e-6, "an empty message still pays the latency alpha"),
             ((1e6, 10e-6, 12.5e9), 10e-6 + 1e6 / 12.5e9, "100 Gb Ethernet: alpha = 10 us, beta = 12.5 GB/s")]

    def diagnose(args, expected, got):
        n, a, b = args
        if math.isclose(got, n / b, rel_tol=1e-9):
            return "you left out the latency alpha, paid once per message"
        if math.isclose(got, a + n * b, rel_tol=1e-9):
            return "beta is a bandwidth in bytes per second: divide the bytes by it"
        if math.isclose(got, a + 8 * n / b, rel_tol=1e-9):
            return "beta is already in bytes/s: no factor of 8"
        return None

    check_cases("send_time", fn, cases, diagnose=diagnose)


def _shift_body(fn, n):
    r = dist.get_rank()
    x = (np.arange(n, dtype=np.float32) + 100.0 * r)
    before = x.copy()
    out = fn(x)
    return out, bool(np.array_equal(x, before))


def check_shift_right(fn: Callable[[np.ndarray], np.ndarray], world_sizes=(2, 3, 4), n: int = 4,
                      timeout: float = 3.0) -> None:
    """``fn(x)`` runs on every rank and returns the ``x`` of the left neighbour, rank (r - 1) mod p.

    Each rank's input is ``arange(n) + 100 * rank``, so a wrong answer shows whose data arrived. A rank
    blocked for ``timeout`` seconds is reported as a deadlock.
    """
    for p in world_sizes:
        res = run_ranks("shift_right", _shift_body, p, args=(fn, n), timeout=timeout)
        got = [v[0] for v in res.values]
        want = [np.arange(n, dtype=np.float32) + 100.0 * ((r - 1) % p) for r in range(p)]

        def diagnose(r, g, w, p=p):
            src = g.reshape(-1)[0] / 100.0 if g.size else None
            if src == r:
                return "a rank returned its own x: return the buffer you received into, not the one you sent"
            if src == (r + 1) % p:
                return "the data came from the right neighbour: send to (r + 1) % p and receive from (r - 1) % p"
            return None

        compare_ranks("shift_right", got, want, context=f"on {p} ranks (rank r's input is arange({n}) + 100*r)",
                      diagnose=diagnose)
        changed = [r for r, v in enumerate(res.values) if not v[1]]
        if changed:
            raise CheckFailed(f"shift_right on {p} ranks: ranks {changed} overwrote their input x\n  hint: receive "
                              "into a new buffer (np.empty_like(x)): a buffer being sent must not change before "
                              "the send completes")
    passed(f"shift_right on {', '.join(map(str, world_sizes))} ranks: every rank holds its left neighbour's data")


def _direct_body(fn, use_library: bool):
    r = dist.get_rank()
    dist.compute(flops=(3 - r % 3) * 1e11, dtype="bf16", name="uneven work")  # ranks arrive at different times
    x = np.arange(6, dtype=np.float64) * (r + 1) + 10.0 ** r
    if use_library:
        dist.all_reduce(x, algorithm="direct")
    else:
        fn(x)
    return x, dist.now()


def check_direct_all_reduce(fn: Callable[[np.ndarray], None]) -> None:
    """``fn(x)``: every rank sends x to rank 0, which sums them and sends the sum back; x holds it, in place."""
    for p in (2, 3, 4, 5):
        mine = run_ranks("direct_all_reduce", _direct_body, p, args=(fn, False))
        ref = run_ranks("direct_all_reduce", _direct_body, p, args=(None, True))
        library = sorted({e.name for e in mine.trace.filter(stream="comm")
                          if not e.name.startswith(("send", "recv", "barrier"))})
        if library:
            raise CheckFailed(f"direct_all_reduce on {p} ranks called {library}\n  hint: the exercise is to write "
                              "it from md.dist.send and md.dist.recv")
        want = sum(np.arange(6, dtype=np.float64) * (r + 1) + 10.0 ** r for r in range(p))
        compare_ranks("direct_all_reduce", [v[0] for v in mine], [want] * p,
                      context=f"on {p} ranks (x must hold the sum in place: write into x, do not rebind it)")
        sent = sum(1 for e in mine.trace.filter(stream="link"))
        if sent != 2 * (p - 1):
            raise CheckFailed(f"direct_all_reduce on {p} ranks sent {sent} messages, expected {2 * (p - 1)}\n"
                              "  hint: p - 1 messages to rank 0, then p - 1 back; the other ranks never talk to each "
                              "other")
        t_mine, t_ref = max(v[1] for v in mine), max(v[1] for v in ref)
        if not math.isclose(t_mine, t_ref, rel_tol=1e-9):
            raise CheckFailed(f"direct_all_reduce on {p} ranks: right sums, but it ends at {t_mine * 1e6:.3f} us "
                              f"instead of {t_ref * 1e6:.3f} us\n  hint: rank 0 can only send the sum once it has "
                              "received every contribution; after that, nothing should wait")
    passed("direct_all_reduce: sums in place on 2-5 ranks, 2(p-1) messages, as fast as the library's")
