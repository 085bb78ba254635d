"""Scaling laws and batch size (book ch7-10; lab 04).

Property: loss falls as a sum of power laws in parameters and data, L = E + A/N^alpha + B/D^beta;
with C = 6 N D fixed, the optimum balances the two terms. The constants are the Chinchilla fit
(Hoffmann et al. 2022, approach 3): E = 1.69, A = 406.4, B = 410.7, alpha = 0.34, beta = 0.28.
(Here alpha and beta are exponents, not latency and bandwidth.)
"""

from __future__ import annotations

import math

from minidist.estimate._check import choice, fraction, nonnegative, positive

CHINCHILLA = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}


def chinchilla_loss(params: float, tokens: float, fit: dict | None = None) -> float:
    """Predicted loss in nats: E + A / N^alpha + B / D^beta."""
    c = CHINCHILLA if fit is None else fit
    N, D = positive("chinchilla_loss", "params", params), positive("chinchilla_loss", "tokens", tokens)
    return c["E"] + c["A"] / N ** c["alpha"] + c["B"] / D ** c["beta"]


def chinchilla_optimal(compute_flops: float, tokens_per_param: float = 20.0,
                       method: str = "rule_of_thumb") -> tuple[float, float]:
    """Compute-optimal (params, tokens) for a budget of C FLOPs with C = 6 N D.

    method="rule_of_thumb": D = 20 N, so N = sqrt(C / 120) (the book's default; 20:1 is empirical).
    method="parametric": minimise the fitted loss on C = 6 N D, giving
    N* = (alpha A / (beta B))^(1/(alpha+beta)) (C/6)^(beta/(alpha+beta)) and D* = C / (6 N*).
    """
    fn = "chinchilla_optimal"
    C = positive(fn, "compute_flops", compute_flops)
    choice(fn, "method", method, ("rule_of_thumb", "parametric"))
    if method == "rule_of_thumb":
        r = positive(fn, "tokens_per_param", tokens_per_param)
        n = math.sqrt(C / (6 * r))
        return n, r * n
    c = CHINCHILLA
    a, b = c["alpha"], c["beta"]
    n = (a * c["A"] / (b * c["B"])) ** (1 / (a + b)) * (C / 6) ** (b / (a + b))
    return n, C / (6 * n)


def critical_batch_size(grad_noise_trace: float, grad_norm_sq: float) -> float:
    """Simple noise scale B_crit = tr(Sigma) / |G|^2 (McCandlish et al. 2018, ch10)."""
    fn = "critical_batch_size"
    return nonnegative(fn, "grad_noise_trace", grad_noise_trace) / positive(fn, "grad_norm_sq", grad_norm_sq)


def steps_to_target(batch: float, s_min: float, s_noise: float) -> float:
    """Optimizer steps to a target loss: S(B) = S_min + S_noise / B; B_crit = S_noise / S_min."""
    fn = "steps_to_target"
    return nonnegative(fn, "s_min", s_min) + nonnegative(fn, "s_noise", s_noise) / positive(fn, "batch", batch)


def batch_scaling_efficiency(b0: float, s0: float, b: float, s: float) -> float:
    """E = (S0 / S) / (B / B0): the step reduction you got over the one perfect scaling would give."""
    fn = "batch_scaling_efficiency"
    return (positive(fn, "s0", s0) / positive(fn, "s", s)) / (positive(fn, "b", b) / positive(fn, "b0", b0))


def scaled_learning_rate(lr0: float, b0: float, b: float, rule: str = "linear") -> float:
    """Learning rate for batch b from (lr0, b0): linear lr0 b/b0 (below B_crit) or sqrt lr0 sqrt(b/b0)."""
    fn = "scaled_learning_rate"
    choice(fn, "rule", rule, ("linear", "sqrt"))
    r = positive(fn, "b", b) / positive(fn, "b0", b0)
    return positive(fn, "lr0", lr0) * (r if rule == "linear" else math.sqrt(r))


def emergence_probability(loss: float, critical_loss: float, tau: float) -> float:
    """Sigmoid emergence model (ch9): P = 1 / (1 + exp(-(L_c - L) / tau))."""
    return 1 / (1 + math.exp(-(critical_loss - loss) / positive("emergence_probability", "tau", tau)))


def emergence_loss_gap(probability: float, tau: float) -> float:
    """Inverse of the sigmoid: L_c - L = tau ln(P / (1 - P))."""
    p = fraction("emergence_loss_gap", "probability", probability, open_low=True)
    if p == 1:
        raise ValueError("emergence_loss_gap: probability must be < 1")
    return positive("emergence_loss_gap", "tau", tau) * math.log(p / (1 - p))
