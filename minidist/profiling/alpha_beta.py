"""The alpha-beta model fitted to measured messages (book ch2, ch32; labs 02, 23).

Property: a message of n bytes costs t = alpha + n / beta, which is linear in n: least squares on (n, t) pairs
of one link gives the intercept alpha and the slope 1 / beta. On the simulated clock the fit recovers the
cluster's constants exactly; on a real machine it is the calibration every cost model starts from.
"""

from __future__ import annotations

import numpy as np


def fit_alpha_beta(sizes, seconds) -> tuple[float, float]:
    """(alpha seconds, beta bytes/s) of the least-squares line through (bytes, seconds); needs two sizes."""
    n, t = np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float)
    if n.shape != t.shape or len(np.unique(n)) < 2:
        raise ValueError(f"fit_alpha_beta: need paired samples of at least two message sizes, got {len(np.unique(n))}"
                         f" sizes for {t.size} times")
    slope, alpha = np.polyfit(n, t, 1)
    if not slope > 0:
        raise ValueError(f"fit_alpha_beta: time does not grow with size (slope {slope:g}): no bandwidth to fit")
    return float(alpha), float(1 / slope)


def link_samples(trace, src: int, dst: int) -> tuple[list[float], list[float]]:
    """(bytes, seconds) of every message from rank ``src`` to ``dst`` in a trace (its ``link`` events)."""
    name = f"{src}->{dst}"
    ev = [e for e in trace.events if e.stream == "link" and e.name == name]
    return [e.nbytes for e in ev], [e.end - e.start for e in ev]
