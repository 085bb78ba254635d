"""``ParallelConfig``: one description of how a training run is split across devices (Parts IV-VI).

The same dataclass carries every strategy: data parallelism (``dp``), ZeRO stages 1-3
(``zero_stage``), FSDP (``fsdp``), gradient accumulation (``microbatches``), activation recomputation
(``recompute``) and offloading (``offload``) (chapters 14, 19-22); tensor parallelism (``tp``), with
``sequence_parallel=True`` for Megatron's sequence parallelism (chapter 15); pipeline parallelism
(``pp``, ``microbatches``, ``schedule``, ``virtual_stages``, ``pp_balance``, chapter 16); context
parallelism (``cp``, with ``cp_method`` "ring" or "ulysses" and ``cp_layout`` "zigzag" or
"contiguous", chapter 17) and expert parallelism (``ep``, for GPTs with ``n_experts``, chapter 18).
``md.parallel.build_mesh`` turns it into a device mesh and ``md.parallel.parallelize`` applies it.

``recompute``: ``None`` keeps every activation; ``"full"`` keeps only each layer's input (a
checkpoint per layer; with ``recompute_layers=n`` only for the first n layers of each stage); an int
``k`` keeps one input per segment of ``k`` layers, so a backward holds (L/k + k) layers of
activations (chapter 21); ``"selective"`` drops only the attention scores.
``offload``: ``None``, ``"optimizer"`` (optimizer state and its update live on the host tier,
ZeRO-Offload) or ``"optimizer+params"`` (the weights too, streamed to the device per layer).

``algorithm`` goes to every collective that offers it (``md.collectives.offered``) and the runtime
chooses for the others, as NCCL_ALGO does: ``"halving_doubling"`` changes the gradient all-reduce,
not the setup broadcast (which has no such algorithm), while ``"ring"`` changes both. An algorithm no
collective offers is refused here.

Every layout ``train`` accepts reproduces one device (``tests/test_compose.py``: every combination of
dp, tp, pp, cp, ep in {1, 2} with every data-parallel flavour and recomputation mode). What it refuses,
with a ValueError before any rank starts, it refuses for a reason of meaning, except the few pairs listed
at the end as not built yet (``refusals.py`` and ``train`` hold every check):

* capacity dropping (``capacity_factor``) with ``cp > 1``: which tokens are dropped would depend on
  how the positions are dealt out;
* MoE with sequence parallelism: a sequence shard would route only its own tokens;
* ``dropout > 0``: the random masks would differ from one layout to another;
* shapes that do not split: heads, hidden sizes or vocabulary over ``tp``, the sequence over ``cp``
  (and each cp rank's ``seq_len / cp`` positions over ``tp`` with sequence parallelism), Ulysses'
  ``n_heads / tp`` query heads over ``cp``,
  experts over ``ep``, layers over ``pp x virtual_stages``, the batch over the ranks and micro-batches.

A mixture-of-experts model's objective is defined per micro-batch, as Megatron-LM and DeepSeek-V3 define it:
expert capacity, the load-balancing loss and the routing counts are those of each global micro-batch (the same
sequences in every layout), so with ``microbatches=m`` the reference is one device accumulating m micro-batches.

Two attention variants of chapter 31a are the exception, refused because the parallel code does not
implement them (rather than compute something else): sliding-window attention (``GPTConfig.window``)
with ``cp > 1``, since ring and Ulysses attention apply the full causal mask only, and latent attention
(``GPTConfig.kv_latent``) with tensor or sequence parallelism, which splits wq, wk, wv by heads.

Not built yet, and refused as such ("not built yet" in the message): gradient ``compression`` with a
mixture-of-experts model (the compressors sit on DDP's reducer, MoE reduces expert and dense gradients
over two groups). (Checkpoints save the loss scaler and the routing biases of ``moe_balance="bias"``, so a
resumed run continues the same one with either.)
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from minidist.collectives import known_algorithms

OFFLOAD = (None, "optimizer", "optimizer+params")
SCHEDULES = ("1f1b", "gpipe", "interleaved", "zero_bubble", "zb-h1", "dualpipev", "dualpipe")


def _is_int(v: object) -> bool:
    """A Python int that is not a bool: counts and stages are refused as True, 1.0 or "1"."""
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class ParallelConfig:
    """How to lay one training step out on ``world_size = dp * tp * pp * cp * ep`` devices."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero_stage: int = 0
    fsdp: bool = False
    microbatches: int = 1
    schedule: str = "1f1b"
    recompute: str | int | None = None
    offload: str | None = None
    bucket_bytes: float = 25 * 2**20  # PyTorch DDP's bucket_cap_mb = 25
    prefetch: int = 1  # ZeRO-3 / FSDP: layers gathered ahead of the one being computed
    # collective algorithm for every collective that offers it, the runtime's choice for the others (NCCL_ALGO's
    # rule: "halving_doubling" changes the gradient all-reduce, not the setup broadcast); None: the runtime chooses
    algorithm: str | None = None
    virtual_stages: int = 1  # pipeline chunks per pp rank (schedule="interleaved")
    pp_balance: str = "even"  # pipeline stage cut: "even" (blocks) or "measured" (FLOPs of each block)
    sequence_parallel: bool = False  # with tp: norms/dropout on sequence shards, AG/RS instead of all-reduce
    # with sequence_parallel: each all-gather / reduce-scatter cut into ring steps hidden behind the matmul that
    # consumes or produces them, and the backward's collectives run under independent matmuls (tp_overlap.py)
    tp_overlap: bool = False
    cp_method: str = "ring"  # context parallelism: "ring" attention or "ulysses" all-to-all
    cp_layout: str = "zigzag"  # how positions are dealt to cp ranks: "zigzag" (balanced causal work) or "contiguous"
    # with recompute="full": only the first n layers of each stage (model chunk) are recomputed, Megatron's
    # --recompute-method block --recompute-num-layers n; None: all of them
    recompute_layers: int | None = None
    # gradient compression (chapter 28): a compressor of md.parallel.data.compression (TopK, PowerSGD, ...) that
    # replaces the data-parallel all-reduce; plain DDP only (ZeRO and FSDP reduce-scatter shards instead)
    compression: object = None

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "cp", "ep", "microbatches"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise ValueError(f"ParallelConfig: {name} must be an int >= 1, got {v!r}")
        # bool and float are refused by type: True == 1 and 1.0 == 1, so a membership test alone takes them
        if not _is_int(self.zero_stage) or self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"ParallelConfig: zero_stage must be the int 0, 1, 2 or 3, got {self.zero_stage!r}")
        if not isinstance(self.fsdp, bool):
            raise ValueError(f"ParallelConfig: fsdp must be True or False, got {self.fsdp!r}")
        if self.fsdp and self.zero_stage not in (0, 3):
            raise ValueError(f"ParallelConfig: fsdp=True shards parameters like ZeRO-3; it cannot be combined with "
                             f"zero_stage={self.zero_stage}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"ParallelConfig: schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        r = self.recompute
        ok = r in (None, "full", "selective") or (_is_int(r) and r >= 1)
        if not ok:
            raise ValueError(f"ParallelConfig: recompute must be None, 'full', 'selective' or an int k >= 1 "
                             f"(a checkpoint every k layers), got {r!r}")
        n = self.recompute_layers
        if n is not None and (r != "full" or not _is_int(n) or n < 1):
            raise ValueError(f"ParallelConfig: recompute_layers must be None or an int >= 1 with recompute='full' "
                             f"(the first n layers of each stage are recomputed), got {n!r} with recompute={r!r}")
        if self.offload not in OFFLOAD:
            raise ValueError(f"ParallelConfig: offload must be one of {OFFLOAD}, got {self.offload!r}")
        if self.offload == "optimizer+params" and not (self.zero_stage == 3 or self.fsdp):
            raise ValueError("ParallelConfig: offload='optimizer+params' streams sharded layers from the host; "
                             "use it with zero_stage=3 or fsdp=True")
        b = self.bucket_bytes
        if not isinstance(b, numbers.Real) or isinstance(b, bool) or not (math.isfinite(b) and b > 0):
            raise ValueError(f"ParallelConfig: bucket_bytes must be a finite number of bytes > 0 (25 * 2**20 for "
                             f"25 MiB), got {b!r}")
        if not _is_int(self.virtual_stages) or self.virtual_stages < 1:
            raise ValueError(f"ParallelConfig: virtual_stages must be an int >= 1, got {self.virtual_stages!r}")
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise ValueError(f"ParallelConfig: virtual_stages={self.virtual_stages} needs schedule='interleaved', "
                             f"got {self.schedule!r}")
        if not isinstance(self.sequence_parallel, bool):
            raise ValueError(f"ParallelConfig: sequence_parallel must be True or False, got {self.sequence_parallel!r}")
        if not isinstance(self.tp_overlap, bool):
            raise ValueError(f"ParallelConfig: tp_overlap must be True or False, got {self.tp_overlap!r}")
        if self.tp_overlap and not self.sequence_parallel:
            raise ValueError("ParallelConfig: tp_overlap=True hides sequence parallelism's all-gathers and "
                             "reduce-scatters behind the matmuls; set sequence_parallel=True (and tp > 1)")
        if self.pp_balance not in ("even", "measured"):
            raise ValueError(f"ParallelConfig: pp_balance must be 'even' or 'measured', got {self.pp_balance!r}")
        if self.algorithm is not None and self.algorithm not in known_algorithms() + ["native"]:
            raise ValueError(f"ParallelConfig: algorithm must be None (the runtime chooses), one of "
                             f"{known_algorithms()} or 'native' (MPI's own, backend='mpi'), got {self.algorithm!r}")
        if not _is_int(self.prefetch) or self.prefetch < 0:
            raise ValueError(f"ParallelConfig: prefetch must be an int >= 0, got {self.prefetch!r}")
        if self.compression is not None:
            if not (hasattr(self.compression, "reduce") and hasattr(self.compression, "payload_bytes")):
                raise ValueError(f"ParallelConfig: compression must be a compressor of md.parallel.data.compression "
                                 f"(TopK(0.01), PowerSGD(2), ...), got {self.compression!r}")
            if self.zero_stage or self.fsdp:
                raise ValueError("ParallelConfig: compression replaces DDP's all-reduce; it does not combine with "
                                 f"zero_stage={self.zero_stage} or fsdp={self.fsdp}, which reduce-scatter shards")

    @classmethod
    def from_layout(cls, plan, **overrides) -> ParallelConfig:
        """The config that runs an estimator layout as is: a ``Layout``, or an ``Estimate`` from
        ``md.estimate.plan`` (which also fixes the number of micro-batches).

        Both describe the same mesh. The estimator counts ``dp`` as every data-parallel rank and carves
        ``ep`` out of it (Megatron's convention); here ``ep`` is a mesh axis of its own, so
        ``dp = layout.dp / layout.ep`` and the world size is the same. ``overrides`` set other fields.
        """
        layout = getattr(plan, "layout", plan)
        for name in ("tp", "pp", "dp", "cp", "ep", "zero_stage", "recompute", "schedule", "virtual", "sp"):
            if not hasattr(layout, name):
                raise TypeError(f"ParallelConfig.from_layout: expected an md.estimate Layout or Estimate, "
                                f"got {type(plan).__name__} without {name!r}")
        if layout.dp % layout.ep:
            raise ValueError(f"ParallelConfig.from_layout: ep={layout.ep} must divide dp={layout.dp}")
        fields = dict(dp=layout.dp // layout.ep, tp=layout.tp, pp=layout.pp, cp=layout.cp, ep=layout.ep,
                      zero_stage=layout.zero_stage, recompute=layout.recompute,
                      microbatches=getattr(plan, "microbatches", 1), schedule=layout.schedule,
                      virtual_stages=layout.virtual, sequence_parallel=bool(layout.sp) and layout.tp > 1,
                      recompute_layers=getattr(layout, "recompute_layers", None))
        fields.update(overrides)
        return cls(**fields)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp * self.ep

    @property
    def shards_params(self) -> bool:
        """Parameters live as 1/dp shards between uses (ZeRO-3 or FSDP)."""
        return self.zero_stage == 3 or self.fsdp

    @property
    def recompute_every(self) -> int | None:
        """Layers per checkpointed segment (1 for "full"), or None when no whole layer is recomputed."""
        if self.recompute == "full":
            return 1
        return self.recompute if isinstance(self.recompute, int) else None
