"""Young-Daly measured: the best checkpoint interval on the simulated clock against sqrt(2 C MTBF).

A tiny GPT on one simulated H100 with a fast checkpoint tier (so a checkpoint costs about half a step),
failures of MTBF 60 steps, a checkpoint every k steps for k from 3 to 40, 600 steps, six failure seeds (with three,
the optimum moved by 20% between seed sets: about 40 failures per point).
The measured optimum is the minimum of the fitted curve a/k + b k + c; the formula's interval is
sqrt(2 C MTBF) / step with C the measured blocking cost of one checkpoint. Target: within 15%.
"""

from __future__ import annotations

import minidist as md
from minidist.hardware.specs import Link
from minidist.parallel.checkpoint_sweep import checkpoint_cost, fitted_optimum, sweep_checkpoint_interval
from minidist.resilience import young_daly_interval

CFG = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2)
CLUSTER = md.Cluster(host_link=Link("burst buffer", 1e-6, 2e12), storage_bw=2e12)
INTERVALS = (3, 5, 8, 12, 18, 27, 40)


def main() -> None:
    step, ckpt = checkpoint_cost(CFG, cluster=CLUSTER)
    mtbf = 60 * step
    formula = young_daly_interval(ckpt, mtbf) / step
    points = sweep_checkpoint_interval(CFG, INTERVALS, mtbf, steps=600, seeds=tuple(range(6)), cluster=CLUSTER)
    print(f"step {step * 1e6:.3f} us, checkpoint {ckpt * 1e6:.3f} us, MTBF {mtbf * 1e6:.2f} us")
    print(f"{'every':>6s} {'overhead':>9s} {'failures':>9s}")
    for k in INTERVALS:
        mine = [p for p in points if p.every == k]
        overhead, failures = (sum(getattr(p, a) for p in mine) / len(mine) for a in ("overhead", "failures"))
        print(f"{k:6d} {overhead:9.3f} {failures:9.1f}")
    measured = fitted_optimum(points)
    print(f"optimum: measured {measured:.2f} steps, sqrt(2 C MTBF) {formula:.2f} steps, "
          f"ratio {measured / formula:.3f} (target within 0.85-1.15)")
