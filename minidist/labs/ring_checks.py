"""Checks for lab 06, ring and tree all-reduce (book chapters 12-13).

The learner's ring all-reduce runs on simulated ranks with inputs that *encode their history*:
rank r's element i is ``2^r * (1 + i K)`` with ``K = 2^(p+1)``. Any partial sum over a set S of
ranks is then ``m (1 + i K)`` with ``m`` the bitmask of S, so every message a rank sends can be
decoded back into "which elements, carrying which ranks' contributions". When the result is wrong
the check replays the book's schedule (at reduce-scatter step k rank r sends chunk (r - k) mod p;
at all-gather step k, chunk (r - k + 1) mod p) and reports the first message that departs from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from minidist import dist
from minidist.estimate import collective_time, ring_tree_crossover_bytes
from minidist.hardware.cluster import Cluster
from minidist.labs.check import CheckFailed, attempt, fail, number, passed
from minidist.labs.ranks import compare_ranks, run_ranks


def _encoded(rank: int, p: int, n: int) -> np.ndarray:
    K = 2.0 ** (p + 1)
    return (2.0**rank) * (1.0 + np.arange(n) * K)


def _decode(values: np.ndarray, p: int) -> list[tuple[int, int]]:
    """(element index, contributor bitmask) for each value of a message."""
    K = 2 ** (p + 1)
    out = []
    for v in np.asarray(values, dtype=np.float64).ravel():
        iv = int(round(v))
        m = iv % K
        i = (iv - m) // (K * m) if m else -1
        out.append((i, m))
    return out


def _ranks_of(mask: int) -> list[int]:
    return [r for r in range(mask.bit_length()) if mask >> r & 1]


def _traced_ring(fn, n):
    """Rank body: run the learner's fn on encoded data, recording every message it sends."""
    r, p = dist.get_rank(), dist.get_world_size()
    x = _encoded(r, p, n)
    sent = []
    orig_send, orig_isend = dist.send, dist.isend

    inside_send = []  # md.dist.send calls md.dist.isend: record that message once, not twice

    def send(t, dst, *a, **k):
        sent.append((dst, np.array(getattr(t, "data", t), dtype=np.float64, copy=True)))
        inside_send.append(True)
        try:
            return orig_send(t, dst, *a, **k)
        finally:
            inside_send.pop()

    def isend(t, dst, *a, **k):
        if not inside_send:
            sent.append((dst, np.array(getattr(t, "data", t), dtype=np.float64, copy=True)))
        return orig_isend(t, dst, *a, **k)

    dist.send, dist.isend = send, isend
    try:
        t0 = dist.now()
        fn(x)
        t1 = dist.now()
    finally:
        dist.send, dist.isend = orig_send, orig_isend
    return x, sent, t1 - t0


_ACCUMULATE = ("At reduce-scatter step k, add the chunk received from the left into chunk (r - k - 1) mod p, the "
               "one you send on at step k + 1")


def _first_departure(sent_by_rank, p: int, n: int) -> str | None:
    """Compare the recorded messages with the book's ring schedule; describe the first difference."""
    bounds = np.cumsum([0] + [len(c) for c in np.array_split(np.arange(n), p)])
    for k in range(2 * (p - 1)):
        for r in range(p):
            msgs = sent_by_rank[r]
            rs = k < p - 1
            step = k if rs else k - (p - 1)
            chunk = (r - step) % p if rs else (r - step + 1) % p
            holders = sorted((r - j) % p for j in range(step + 1)) if rs else list(range(p))
            what = (f"at {'reduce-scatter' if rs else 'all-gather'} step {step} rank {r} should send chunk {chunk} "
                    f"(elements {bounds[chunk]}..{bounds[chunk + 1] - 1}) to rank {(r + 1) % p}, carrying the sum over "
                    f"ranks {holders}")
            if k >= len(msgs):
                return f"{what}, but it sent only {len(msgs)} messages in all"
            dst, vals = msgs[k]
            decoded = _decode(vals, p)
            idx = [i for i, _ in decoded]
            masks = {m for _, m in decoded}
            want_idx = list(range(bounds[chunk], bounds[chunk + 1]))
            want_mask = sum(1 << h for h in holders)
            if dst != (r + 1) % p:
                return f"{what}; it sent its message number {k} to rank {dst}"
            if idx != want_idx:
                return f"{what}; it sent elements {idx[:4]}{'...' if len(idx) > 4 else ''} instead"
            if masks != {want_mask}:
                got = sorted({h for m in masks for h in _ranks_of(m)})
                if not rs and step == 0:  # the first all-gather message is the reduce-scatter's result
                    return (f"the reduce-scatter left rank {r} with an incomplete chunk {chunk}: it carries ranks "
                            f"{got}, not all {p}. {_ACCUMULATE}")
                if rs and step and len(masks) == 1 and set(got) < set(holders):  # a reduce-scatter sum lost a term
                    return (f"{what}; the values it sent carry only ranks {got}: the reduce-scatter did not add what "
                            f"it received at step {step - 1} into this chunk. {_ACCUMULATE}")
                return f"{what}; the values it sent carry ranks {got}"
    return None


def _wrong_result(results, p: int, n: int) -> str | None:
    """Every message followed the schedule, yet a result is wrong: say what happened to which chunk."""
    bounds = np.cumsum([0] + [len(c) for c in np.array_split(np.arange(n), p)])
    want = sum(_encoded(q, p, n) for q in range(p))
    for r, got in enumerate(results):
        got = np.asarray(got, dtype=np.float64).reshape(-1)
        if got.shape != want.shape or np.array_equal(got, want):
            continue
        if np.array_equal(got, _encoded(r, p, n)):
            return (f"rank {r}'s x is unchanged: the result must be written into x in place (work on the views "
                    "np.array_split(x, p) returns, or finish with x[...] = result; `x = ...` only rebinds the name)")
        wrong = [c for c in range(p) if not np.array_equal(got[bounds[c]:bounds[c + 1]], want[bounds[c]:bounds[c + 1]])]
        received = sorted((r - k) % p for k in range(p - 1))  # the chunks the all-gather delivers to rank r
        if set(wrong) <= set(received):
            return (f"every message followed the ring schedule, but rank {r}'s chunks {wrong}, which it receives in "
                    "the all-gather, are wrong: store the chunk received at all-gather step k in chunk (r - k) mod p, "
                    "replacing its contents (receive straight into it; do not add)")
        mine = _encoded(r, p, n)
        kept = [c for c in wrong if np.array_equal(got[bounds[c]:bounds[c + 1]], mine[bounds[c]:bounds[c + 1]])]
        if kept:
            return (f"rank {r}'s chunks {kept} still hold its own input: the sums never reached x. Add in place into "
                    "the views np.array_split(x, p) returns (chunk += incoming, or chunk[...] = ...); "
                    "`chunks[i] = chunks[i] + incoming` only rebinds the list entry")
        return (f"every message followed the ring schedule, but rank {r}'s chunk {(r + 1) % p}, complete when it sent "
                "it at all-gather step 0, was changed afterwards: in the all-gather receive into chunk (r - k) mod p "
                "only")
    return None


def _slowness(sent_by_rank, p: int, n: int, t: float, ideal: float, itemsize: int = 8) -> str:
    """Why a correct ring does not take the ring's time: bigger, more or fewer messages, or serialised steps."""
    steps, chunk = 2 * (p - 1), -(-n // p)
    want_bytes = steps * itemsize * n / p
    r = max(range(p), key=lambda q: (sum(v.size for _, v in sent_by_rank[q]), len(sent_by_rank[q])))
    sizes = [v.size for _, v in sent_by_rank[r]]
    count, sent, largest = len(sizes), sum(sizes) * itemsize, max(sizes, default=0)
    measured = (f"rank {r} sent {count} message(s), {sent:,.0f} bytes in all; the ring sends 2(p-1) = {steps} "
                f"chunks of n/p = {n // p} elements ({n // p * itemsize:,} bytes each), {want_bytes:,.0f} bytes in all")
    if largest > chunk:
        what = "the whole buffer" if largest == n else f"{largest} elements"
        msg = (f"{measured}. Its largest message was {what} ({largest * itemsize:,} bytes): "
               f"{'too many bytes' if sent > want_bytes * (1 + 1e-9) else 'too few, too big messages'}. "
               "Send one chunk (np.array_split(x, p)[i]) per step, not the whole buffer")
        if t < ideal:
            msg += (" (at this small n fewer messages save more latency than the bigger ones cost; as n grows the "
                    "bytes dominate and whole-buffer messages fall behind the ring)")
        return msg
    if count > steps:
        return f"{measured}: every extra message pays the latency alpha again"
    if count < steps or sent < want_bytes * (1 - 1e-9):
        return f"{measured}: follow the ring's schedule, one chunk per step"
    return ("each step must send and receive at the same time (isend to the right, recv from the left, then "
            "wait): a send followed by a receive serialises the two transfers")


def check_ring_all_reduce(fn: Callable[[np.ndarray], None], alpha: float = 1e-6, beta: float = 1e9) -> None:
    """``fn(x)`` all-reduces (sums) ``x`` in place across the ranks, as a ring, and costs the ring's time.

    Every case must be correct first; then the time of the cases with n divisible by p must be the ring's. When
    it is not, the failure reports the largest such case, where bandwidth dominates and a wrong message size shows.
    """
    slow = None
    for p, n in [(2, 8), (3, 9), (4, 10), (5, 12), (4, 3), (4, 4096)]:
        cluster = Cluster.uniform(alpha, beta)
        res = run_ranks("ring_all_reduce", _traced_ring, p, args=(fn, n), cluster=cluster)
        library = sorted({e.name for e in res.trace.filter(stream="comm")
                          if not e.name.startswith(("send", "recv", "barrier"))})
        if library:
            fail(f"ring_all_reduce on {p} ranks called a library collective", "only md.dist.isend / md.dist.recv",
                 library, "the exercise is to build the ring yourself: 2(p-1) steps, each an isend of one chunk to "
                          "the right neighbour and a recv from the left one")
        want = sum(_encoded(r, p, n) for r in range(p))
        results = [v[0] for v in res]
        try:
            compare_ranks("ring_all_reduce", results, [want] * p, context=f"on {p} ranks with n = {n}")
        except CheckFailed as e:
            where = _first_departure([v[1] for v in res], p, n)
            if where:
                raise CheckFailed(f"{e}\n  first departure from the ring schedule: {where}") from None
            why = _wrong_result(results, p, n)
            if why:
                raise CheckFailed(f"{e}\n  hint: {why}") from None
            raise
        if n % p == 0:
            t = max(v[2] for v in res)
            ideal = collective_time("all_reduce", n * 8, p, alpha, beta, "ring")
            if not math.isclose(t, ideal, rel_tol=1e-9):
                slow = (p, n, t, ideal, [v[1] for v in res])
    if slow:
        p, n, t, ideal, sent = slow
        hint = _slowness(sent, p, n, t, ideal)
        if t > 1.5 * ideal:
            hint = "you are correct but slow: " + hint
        fail(f"ring_all_reduce on {p} ranks (n = {n} float64) is correct but its simulated time is off",
             f"{ideal * 1e6:.3f} us = 2(p-1) alpha + 2(p-1)/p n/beta", f"{t * 1e6:.3f} us", hint)
    passed("ring_all_reduce: correct on 2-5 ranks (uneven chunks too) and as fast as the ring formula")


def check_collective_times(ring_fn: Callable, tree_fn: Callable) -> None:
    """``ring_fn(n, p, alpha, beta)`` and ``tree_fn(...)`` are the all-reduce closed forms (p a power of two)."""
    for n, p, a, b in [(1e8, 8, 1e-6, 450e9), (4096, 8, 1e-6, 450e9), (1e9, 64, 5e-6, 50e9), (1e3, 2, 2e-6, 5e10)]:
        for name, fn, algo, hint in [
            ("ring_time", ring_fn, "ring", "2(p-1) steps, each alpha + (n/p)/beta"),
            ("tree_time", tree_fn, "tree", "a binomial reduce then a broadcast: 2 log2(p) steps of alpha + n/beta"),
        ]:
            got = attempt(name, fn, n, p, a, b)
            want = collective_time("all_reduce", n, p, a, b, algo)
            what = f"{name}(n={n:g}, p={p}, alpha={a:g}, beta={b:g})"
            if not math.isclose(number(what, got), want, rel_tol=1e-9):
                fail(what, want, got, hint)
    passed("ring_time and tree_time match the closed forms")


def check_ring_tree_crossover(fn: Callable[[int, float, float], float]) -> None:
    """``fn(p, alpha, beta)`` is the size where ring and tree all-reduce take the same time."""
    for p, a, b in [(8, 1e-6, 450e9), (64, 5e-6, 50e9), (16, 2e-6, 100e9)]:
        got = attempt("crossover", fn, p, a, b)
        want = ring_tree_crossover_bytes(p, a, b)
        if not math.isclose(number(f"crossover(p={p}, alpha={a:g}, beta={b:g})", got), want, rel_tol=1e-6):
            fail(f"crossover(p={p}, alpha={a:g}, beta={b:g})", want, got,
                 "set 2(p-1) a + 2(p-1)/p n/b equal to 2 log2(p) (a + n/b) and solve the linear equation for n")
    passed("crossover matches n* = 2 alpha beta (p - 1 - log2 p) / (2 log2 p - 2 (p-1)/p)")


def check_halving_doubling_all_reduce(fn: Callable[[np.ndarray], None], alpha: float = 1e-6,
                                      beta: float = 1e9) -> None:
    """``fn(x)`` sums ``x`` in place across a power-of-two number of ranks by recursive halving (a reduce-scatter)
    then recursive doubling (an all-gather), in the time ``2 log2(p) alpha + 2 (p-1)/p n / beta``."""
    for p, n in [(2, 8), (4, 16), (8, 64), (4, 4096), (8, 8192)]:
        res = run_ranks("halving_doubling_all_reduce", _traced_ring, p, args=(fn, n),
                        cluster=Cluster.uniform(alpha, beta))
        library = sorted({e.name for e in res.trace.filter(stream="comm")
                          if not e.name.startswith(("send", "recv", "barrier"))})
        if library:
            fail(f"halving_doubling_all_reduce on {p} ranks called a library collective",
                 "only md.dist.isend / md.dist.recv", library, "build it from point-to-point exchanges")
        want = sum(_encoded(r, p, n) for r in range(p))
        compare_ranks("halving_doubling_all_reduce", [v[0] for v in res], [want] * p,
                      context=f"on {p} ranks with n = {n}")
        peers = sorted({dst for dst, _ in res[0][1]})
        t = max(v[2] for v in res)
        ideal = collective_time("all_reduce", n * 8, p, alpha, beta, "halving_doubling")
        if math.isclose(t, ideal, rel_tol=1e-9):
            continue
        sizes = [len(m) for _, m in res[0][1]]
        if math.isclose(t, collective_time("all_reduce", n * 8, p, alpha, beta, "tree"), rel_tol=1e-9) \
                or (sizes and max(sizes) == n):
            hint = ("a step that sends the whole buffer pays the tree's bandwidth: send the half you are giving "
                    "up, and keep halving the part you are responsible for")
        elif len(sizes) > 2 * int(math.log2(p)):
            hint = (f"rank 0 sent {len(sizes)} messages; recursive halving and doubling need {int(math.log2(p))} "
                    f"exchanges each, with partners at distance p/2, p/4, ..., 1 (rank XOR distance)")
        else:
            hint = ("rank 0 talked to ranks " + str(peers) + f"; its {len(sizes)} messages held {sizes} values: "
                    "each halving step sends half of what is left, and the doubling steps retrace them backwards")
        fail(f"halving_doubling_all_reduce on {p} ranks (n = {n} float64) is correct but its simulated time is off",
             f"{ideal * 1e6:.3f} us", f"{t * 1e6:.3f} us", hint)
    passed("halving_doubling_all_reduce: correct on 2, 4 and 8 ranks, in 2 log2(p) steps and the ring's bytes")
