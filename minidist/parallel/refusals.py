"""The layouts ``md.parallel.train`` refuses, each with its reason, checked before any rank starts.

Two kinds of reason, and the messages say which: a layout that would compute something else than one
device (a different objective, masks or dropped tokens that depend on the layout), and a composition
that is not built yet. ``tests/test_compose.py`` keeps the second kind honest: every combination of the
grid either equals one device or is refused here, and the recorded refusals may only shrink.
"""

from __future__ import annotations

from minidist.parallel.config import ParallelConfig
from minidist.parallel.context_parallel import LAYOUTS, METHODS
from minidist.parallel.schedules import ALIASES, check_schedule, make_schedule
from minidist.parallel.tensor_parallel_model import check_divisible


def check_layout(cfg, pc: ParallelConfig, global_batch: int) -> None:
    """Raise ValueError if ``pc`` cannot train ``cfg`` (a GPTConfig) with ``global_batch`` sequences."""
    if global_batch < pc.dp * pc.microbatches:
        raise ValueError(f"parallel.train: global_batch={global_batch} cannot give every one of dp={pc.dp} ranks "
                         f"{pc.microbatches} micro-batch(es) of at least one sequence")
    if pc.pp > 1:
        _pipeline(cfg, pc)
    if cfg.dropout:
        raise ValueError(f"parallel.train: dropout must be 0 (random masks would differ between layouts), "
                         f"got {cfg.dropout}")
    if cfg.tie_embeddings and pc.shards_params:
        raise ValueError("parallel.train: tie_embeddings=True is not supported with zero_stage=3 or fsdp "
                         "(the tied matrix would belong to two units)")
    if pc.tp > 1 or pc.sequence_parallel:
        check_divisible(cfg, pc.tp, pc.sequence_parallel)
    if pc.cp > 1 or pc.ep > 1 or cfg.n_experts:
        _tokens(cfg, pc)
        if global_batch < pc.dp * pc.ep * pc.microbatches:
            raise ValueError(f"parallel.train: global_batch={global_batch} cannot give every one of dp x ep = "
                             f"{pc.dp * pc.ep} ranks {pc.microbatches} micro-batch(es) of at least one sequence")


def build_schedule(config, n_layers: int):
    """The checked schedule of ``config`` (``schedule``, ``pp``, ``microbatches``, ``virtual_stages``)."""
    v = getattr(config, "virtual_stages", 1)
    name = ALIASES.get(config.schedule, config.schedule)
    if v > 1 and name != "interleaved":
        raise ValueError(f"parallel.train: virtual_stages={v} needs schedule='interleaved', got {config.schedule!r}")
    if n_layers < config.pp * v:
        raise ValueError(f"parallel.train: pp={config.pp} x virtual_stages={v} stages need at least that many "
                         f"layers, the model has n_layers={n_layers}")
    return check_schedule(make_schedule(name, config.pp, config.microbatches, v))


def _pipeline(cfg, pc) -> None:
    if pc.shards_params or pc.offload is not None or pc.ep > 1:
        raise ValueError("parallel.train: pp > 1 composes with dp (DDP, ZeRO-1, ZeRO-2), tp (with or without "
                         "sequence parallelism), cp and recompute for now; ZeRO-3, FSDP, offload and ep with "
                         "pipelining are not implemented yet")
    if cfg.tie_embeddings:
        raise ValueError("parallel.train: tie_embeddings=True puts one matrix on the first and the last pipeline "
                         "stage; untie it for pp > 1")
    if getattr(cfg, "n_experts", 0):
        raise ValueError("parallel.train: pp > 1 with a mixture-of-experts model is not implemented yet (the "
                         "pipeline's last stage computes the plain cross-entropy, without the router's losses)")
    build_schedule(pc, cfg.n_layers)


def _tokens(cfg, pc) -> None:
    """Context and expert parallelism, and mixture-of-experts models."""
    if pc.cp_method not in METHODS:
        raise ValueError(f"parallel.train: cp_method must be one of {METHODS}, got {pc.cp_method!r}")
    if pc.cp_layout not in LAYOUTS:
        raise ValueError(f"parallel.train: cp_layout must be one of {LAYOUTS}, got {pc.cp_layout!r}")
    if (pc.ep > 1 or cfg.n_experts) and pc.sequence_parallel:
        raise ValueError("parallel.train: mixture-of-experts models do not compose with sequence_parallel (a "
                         "sequence shard would route only its own tokens: other capacities and router losses); "
                         f"got ep={pc.ep}, n_experts={cfg.n_experts}")
    if pc.cp > 1 and pc.sequence_parallel:
        raise ValueError("parallel.train: cp with sequence_parallel is not built yet (both would cut the "
                         "sequence and the positions); use tp without sequence_parallel with cp")
    if (pc.ep > 1 or cfg.n_experts) and pc.pp > 1:
        raise ValueError("parallel.train: ep and mixture-of-experts models do not compose with pp yet; "
                         f"got ep={pc.ep}, n_experts={cfg.n_experts}, pp={pc.pp}")
    if pc.cp > 1:
        pieces = pc.cp * (2 if pc.cp_layout == "zigzag" else 1)
        if cfg.seq_len % pieces:
            raise ValueError(f"parallel.train: seq_len={cfg.seq_len} must split into {pieces} equal chunks "
                             f"(cp={pc.cp}, cp_layout={pc.cp_layout!r})")
        if pc.cp_method == "ulysses" and (cfg.n_heads // pc.tp) % pc.cp:
            raise ValueError(f"parallel.train: Ulysses deals each rank's {cfg.n_heads // pc.tp} query heads "
                             f"(n_heads={cfg.n_heads} / tp={pc.tp}) out over cp={pc.cp}: they must divide evenly")
    if pc.ep > 1:
        if not cfg.n_experts:
            raise ValueError(f"parallel.train: ep={pc.ep} needs a mixture-of-experts model (GPTConfig(n_experts=...))")
        if cfg.n_experts % pc.ep:
            raise ValueError(f"parallel.train: {cfg.n_experts} experts cannot be split evenly over ep={pc.ep}")
    if cfg.n_experts and pc.cp > 1 and cfg.capacity_factor is not None:
        # capacity serves a rank's tokens before the next rank's; cp ranks hold interleaved pieces of
        # the same sequences, so the dropped set would differ from one device's
        raise ValueError("parallel.train: capacity dropping with cp > 1 would depend on the layout; "
                         "use capacity_factor=None with context parallelism")
    if cfg.n_experts and pc.microbatches > 1:
        raise ValueError("parallel.train: a mixture-of-experts model trains with microbatches=1: expert capacity and "
                         "the load-balancing loss are statistics of the whole batch, and accumulating micro-batches "
                         "would compute them per micro-batch, a different objective "
                         f"(got microbatches={pc.microbatches})")
    if cfg.n_experts and pc.shards_params:
        raise ValueError("parallel.train: mixture-of-experts models train with zero_stage 0, 1 or 2 for now "
                         "(ZeRO-3 and FSDP, which gather a block's weights over one group, are not built for "
                         f"experts that live on one ep rank); got zero_stage={pc.zero_stage}, fsdp={pc.fsdp}")
