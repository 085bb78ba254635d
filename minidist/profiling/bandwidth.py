"""Collectives measured the way nccl-tests prints them: time, algorithm and bus bandwidth (book ch11, ch32).

Property: a collective's *algorithm bandwidth* is the buffer size over the time; its *bus bandwidth* rescales
that by how much data each rank must move at best, so that every collective and every group size is compared
with the link's own speed: an all-reduce moves 2 (p-1)/p of the buffer through each rank, an all-gather or a
reduce-scatter (p-1)/p, a broadcast the whole buffer once. A busbw close to the link's beta means the
algorithm is bandwidth-optimal at that size; far below it, latency or contention dominates.
"""

from __future__ import annotations

import numpy as np

from minidist.estimate.comm import BUS_FACTOR


def _base(name: str) -> str:
    """The collective behind a trace event's name (``all_gather_into_tensor`` -> ``all_gather``)."""
    return name.split(".")[0].replace("_into_tensor", "").replace("_tensor", "").replace("_single", "")


def bus_factor(name: str, p: int) -> float:
    """nccl-tests' factor from algorithm to bus bandwidth for a collective over ``p`` ranks (the estimator's
    ``bus_bandwidth`` rule, applied to a trace event's name)."""
    base = _base(name)
    if base not in BUS_FACTOR:
        raise ValueError(f"bus_factor: no bus-bandwidth rule for {name!r}; known: {sorted(BUS_FACTOR)}")
    return BUS_FACTOR[base](p)


def collective_table(trace, rank: int, group_size: int, predict=None,
                     window: tuple[float, float] | None = None) -> list[dict]:
    """One row per collective ``rank`` ran: name, bytes, seconds, algbw and busbw (bytes/s), and
    ``predicted`` seconds if ``predict(name, nbytes)`` is given (an alpha-beta formula). ``window``
    ``(start, end)``, e.g. one step of ``TrainResult.windows[rank]``, keeps the collectives that began in it."""
    lo, hi = window if window is not None else (-np.inf, np.inf)
    rows = []
    for e in sorted((e for e in trace.events if e.rank == rank and e.stream == "comm" and lo <= e.start < hi),
                    key=lambda e: e.start):
        t = e.end - e.start
        if t <= 0 or _base(e.name) not in BUS_FACTOR:
            continue
        algbw = e.nbytes / t
        row = {"name": e.name, "bytes": e.nbytes, "seconds": t, "algbw": algbw,
               "busbw": algbw * bus_factor(e.name, group_size)}
        if predict is not None:
            row["predicted"] = predict(e.name, e.nbytes)
        rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    """The rows in nccl-tests' column order."""
    head = f"{'collective':24s} {'bytes':>12s} {'time us':>10s} {'algbw GB/s':>11s} {'busbw GB/s':>11s}"
    if rows and "predicted" in rows[0]:
        head += f" {'alpha-beta us':>14s}"
    lines = [head]
    for r in rows:
        line = (f"{r['name']:24s} {r['bytes']:12,.0f} {r['seconds'] * 1e6:10.2f} {r['algbw'] / 1e9:11.2f} "
                f"{r['busbw'] / 1e9:11.2f}")
        if "predicted" in r:
            line += f" {r['predicted'] * 1e6:14.2f}"
        lines.append(line)
    return "\n".join(lines)
