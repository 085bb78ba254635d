"""md.parallel.train on the simulated clock: what bucketing, ZeRO, prefetch and offloading cost.

All numbers are *simulated* (deterministic) except the last column, the wall-clock seconds the run
took on this machine. A GPT (d_model 64, 4 layers, seq 32, batch 16, float64) on 4 ranks of a
uniform cluster (alpha 0.1 us, beta 50 GB/s, where compute and communication
are of the same size, so overlap matters): step time, bytes sent per rank and peak model state
per rank, against the closed forms of md.estimate.
"""

from __future__ import annotations

import time

import minidist as md
from minidist.estimate import model_state_breakdown, zero_comm_bytes
from minidist.parallel import ParallelConfig, train

CFG = md.GPTConfig(vocab_size=64, seq_len=32, d_model=64, n_layers=4, n_heads=4)
CLUSTER = md.Cluster.uniform(alpha=1e-7, beta=50e9)
DP = 4

RUNS = [
    ("DDP, one bucket", ParallelConfig(dp=DP, bucket_bytes=1e12, algorithm="ring")),
    ("DDP, 64 KB buckets", ParallelConfig(dp=DP, bucket_bytes=2**16, algorithm="ring")),
    ("DDP, 256 KB buckets", ParallelConfig(dp=DP, bucket_bytes=2**18, algorithm="ring")),
    ("DDP, 1 MB buckets", ParallelConfig(dp=DP, bucket_bytes=2**20, algorithm="ring")),
    ("ZeRO-1", ParallelConfig(dp=DP, zero_stage=1, bucket_bytes=2**18, algorithm="ring")),
    ("ZeRO-2", ParallelConfig(dp=DP, zero_stage=2, bucket_bytes=2**18, algorithm="ring")),
    ("ZeRO-3, no prefetch", ParallelConfig(dp=DP, zero_stage=3, prefetch=0, algorithm="ring")),
    ("ZeRO-3, prefetch 1", ParallelConfig(dp=DP, zero_stage=3, prefetch=1, algorithm="ring")),
    ("FSDP", ParallelConfig(dp=DP, fsdp=True, algorithm="ring")),
    ("ZeRO-2 + offload optimizer", ParallelConfig(dp=DP, zero_stage=2, offload="optimizer", bucket_bytes=2**18,
                                                   algorithm="ring")),
    ("ZeRO-3 + recompute full", ParallelConfig(dp=DP, zero_stage=3, recompute="full", algorithm="ring")),
]


def main() -> None:
    print(f"{'layout':30s} {'step us':>9s} {'MB sent':>8s} {'formula':>8s} {'state KB':>9s} {'formula':>8s} "
          f"{'act KB':>7s} {'wall s':>6s}")
    for name, pc in RUNS:
        t0 = time.perf_counter()
        r = train(CFG, pc, steps=2, global_batch=16, cluster=CLUSTER)
        wall = time.perf_counter() - t0
        psi, sb = r.num_params, r.state_bytes
        stage = 3 if pc.shards_params else pc.zero_stage
        state = sum(r.memory[0][k] for k in ("params", "grads", "optimizer"))
        want = model_state_breakdown(psi, stage, DP, sb["params"], sb["grads"], 0 if pc.offload else sb["optimizer"])
        print(f"{name:30s} {r.time[-1] * 1e6:9.2f} {r.comm_bytes[-1][0] / 1e6:8.4f} "
              f"{zero_comm_bytes(psi, DP, stage, 8) / 1e6:8.4f} {state / 1e3:9.1f} {sum(want.values()) / 1e3:8.1f} "
              f"{r.memory[0]['activations'] / 1e3:7.1f} {wall:6.2f}")


if __name__ == "__main__":
    main()
