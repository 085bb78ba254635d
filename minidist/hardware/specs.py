"""Hardware constants: GPUs (peak FLOP/s by dtype, HBM size and bandwidth) and links (alpha, beta).

The numbers live in ``hardware.json`` beside this file (copied from the project's reference data,
with the vendor sources it cites). Units are SI: bytes, seconds, FLOP/s, and bandwidth ``beta`` in
bytes per second per direction, so a message of ``n`` bytes over a link costs ``alpha + n / beta``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

_DATA = json.loads((Path(__file__).with_name("hardware.json")).read_text())


# the peak format a numpy dtype's arithmetic is charged at
FORMAT_OF = {"float64": "fp32", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class GPU:
    """One accelerator: ``peak_flops`` maps a dtype name (fp32, tf32, bf16, fp16, fp8) to FLOP/s."""

    name: str
    hbm_bytes: float
    hbm_bw: float
    peak_flops: dict = field(default_factory=dict)
    nvlink_bw: float | None = None

    def peak(self, dtype: str = "bf16") -> float:
        """Dense peak FLOP/s for ``dtype``; float64/float32 arrays are charged at the fp32 peak."""
        key = FORMAT_OF.get(dtype, dtype)
        if key not in self.peak_flops:
            raise ValueError(f"GPU {self.name!r} has no peak for dtype {dtype!r}; known: {sorted(self.peak_flops)}")
        return self.peak_flops[key]


@dataclass(frozen=True)
class Link:
    """A point-to-point link: latency ``alpha`` (s) and bandwidth ``beta`` (bytes/s, one direction)."""

    name: str
    alpha: float
    beta: float

    def time(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` over this link: alpha + n / beta."""
        return self.alpha + nbytes / self.beta


GPUS: dict[str, GPU] = {
    name: GPU(name, g["hbm_bytes"], g["hbm_bw"], dict(g["peak_flops"]), g.get("nvlink_bw"))
    for name, g in _DATA["gpus"].items()
}
LINKS: dict[str, Link] = {name: Link(name, l["alpha_s"], l["bw"]) for name, l in _DATA["links"].items()}
STORAGE: dict[str, float] = dict(_DATA["storage"])


def gpu(name: str) -> GPU:
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; known: {sorted(GPUS)}") from None


def link(name: str) -> Link:
    try:
        return LINKS[name]
    except KeyError:
        raise ValueError(f"unknown link {name!r}; known: {sorted(LINKS)}") from None
