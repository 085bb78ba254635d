"""LLaMA 3 405B on 16,384 simulated H100s (TP 8, PP 16, DP 128): one step, shape-only, one rank per stage, on the
ideal and on the measured device, each split into compute, bubble and exposed collectives.

Targets: under 60 s of wall time and under 4 GB of memory on the course machine (2 cores), measured in a fresh
process so that nothing else counts. Printed beside it: the same layout from the closed-form estimator and the
published figures (Llama 3 report, Table 4), a cut of 16 layers on PP 2 (how wall time scales with what is
simulated), and LLaMA 3 70B on the planner's best layout for 2,048 GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from minidist.viz import print_side_by_side

_CHILD = """
import json, resource, time
from minidist.viz.at_scale import side_by_side
t = time.perf_counter()
rows = side_by_side("llama3_405b")
wall = time.perf_counter() - t
print(json.dumps({"rows": rows, "wall": wall, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""

_PLANNED = """
import json
from minidist.viz.at_scale import side_by_side
print(json.dumps({"rows": side_by_side("llama3_70b", gpus=2048)}))
"""

_CUT = """
import json, resource, time
from minidist.estimate import model
from minidist.parallel.at_scale import gpt_config, simulate_step
from minidist.viz.at_scale import published_parallel
pc, batch = published_parallel("llama3_405b", pp=2, virtual_stages=1, schedule="1f1b")
step = simulate_step(gpt_config(model("llama3_405b"), n_layers=16), pc, batch)
print(json.dumps({"wall": step.wall_seconds, "step": step.step_time, "gpus": step.gpus,
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def _run(code: str) -> dict:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    cut = _run(_CUT)
    print(f"cut: 16 layers on PP 2 x TP 8 x DP 128 ({cut['gpus']} GPUs): {cut['wall']:.1f} s wall, "
          f"{cut['rss'] / 1e9:.2f} GB, {cut['step']:.3f} s simulated step")
    got = _run(_CHILD)
    rows = got["rows"]
    print("LLaMA 3 405B, Meta's layout (TP 8, PP 16, DP 128) on 16,384 H100s:")
    print_side_by_side(rows)
    wall, rss = rows[0]["wall_seconds"], got["rss"]
    print(f"LLaMA 3 405B, 16,384 GPUs: {wall:.1f} s wall (target 60 s: ratio {wall / 60:.2f}), "
          f"{rss / 1e9:.2f} GB peak memory of the process (target 4 GB: ratio {rss / 4e9:.2f})")
    at_peak = next(r for r in rows if "at peak" in r["source"])
    measured = next(r for r in rows if r.get("kernels") == "measured")
    print(f"simulated / published step: {rows[0]['step_time'] / rows[-1]['step_time']:.3f} (ideal device), "
          f"{measured['step_time'] / rows[-1]['step_time']:.3f} (measured device); "
          f"simulated / estimator at peak: {rows[0]['step_time'] / at_peak['step_time']:.3f}")
    planned = _run(_PLANNED)["rows"]
    print(f"\nLLaMA 3 70B, the planner's best layout on 2,048 H100s ({planned[0]['wall_seconds']:.1f} s wall):")
    print_side_by_side(planned)


if __name__ == "__main__":
    main()
