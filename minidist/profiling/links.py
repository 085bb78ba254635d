"""A slow link, found from the messages that crossed it (book ch33, lab 23).

Property: a degraded cable slows every message on it and no other, and in a symmetric collective every link
carries the same messages, so each link's median bandwidth per message should agree; the robust z-score of
their logarithms (median and MAD again, see ``stragglers``) singles out the one that does not. Compute time
is untouched, which is what tells a slow link from a slow rank.

A fabric that is slow everywhere has no outlier to find: every inter-node link is slow alike. Against the links'
rated alpha and beta (``link_efficiency``) it shows: each message took longer than ``alpha + n / beta`` by the same
factor on every inter-node link, while the links inside the nodes keep their rating.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from minidist.profiling.stragglers import robust_z


def link_bandwidths(trace, min_bytes: float = 1.0) -> dict[tuple[int, int], float]:
    """Median bytes/s of the messages of at least ``min_bytes`` on each directed link ``(src, dst)``."""
    rates: dict[tuple[int, int], list[float]] = defaultdict(list)
    for e in trace.events:
        if e.stream == "link" and e.nbytes >= min_bytes and e.end > e.start:
            src, dst = (int(x) for x in e.name.split("->"))
            rates[(src, dst)].append(e.nbytes / (e.end - e.start))
    return {k: float(np.median(v)) for k, v in sorted(rates.items())}


def slow_links(trace, threshold: float = 3.5, min_bytes: float = 1.0, ratio: float = 0.7) -> list[tuple[int, int]]:
    """Directed links whose bandwidth is an outlier on the slow side: robust z of log bandwidth below -threshold
    and below ``ratio`` x the median (identical healthy links make the MAD tiny; the ratio keeps rounding-level
    differences from counting)."""
    bw = link_bandwidths(trace, min_bytes)
    if len(bw) < 3:
        return []
    z = robust_z(np.log(list(bw.values())))
    med = float(np.median(list(bw.values())))
    return [k for k, zi in zip(bw, z) if zi < -threshold and bw[k] < ratio * med]


def link_efficiency(trace, cluster, min_bytes: float = 1.0) -> dict[tuple[int, int], float]:
    """Per directed link, the median of (rated time ``alpha + n / beta`` on ``cluster``'s link) / (measured time)
    over its messages: 1 on a link that delivers its rating, 1/k on one running at 1/k of its bandwidth."""
    ratios: dict[tuple[int, int], list[float]] = defaultdict(list)
    for e in trace.events:
        if e.stream == "link" and e.nbytes >= min_bytes and e.end > e.start:
            src, dst = (int(x) for x in e.name.split("->"))
            ratios[(src, dst)].append(cluster.link(src, dst).time(e.nbytes) / (e.end - e.start))
    return {k: float(np.median(v)) for k, v in sorted(ratios.items())}
