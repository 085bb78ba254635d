"""The layouts ``md.parallel.train`` refuses, each with its reason, checked before any rank starts.

Every reason is one of meaning: a layout that would compute something else than one device (another
objective, masks or dropped tokens that depend on the layout), or a shape that does not split evenly.
Two attention variants are refused because the parallel code does not implement them: a sliding
window with context parallelism, latent attention with tensor parallelism; and one pair is refused
because it is not built yet (compression with MoE), its message says so.
The list, in words, is in ``ParallelConfig``'s docstring; ``tests/test_compose.py`` shows that every
other combination of the strategies trains exactly like one device.
"""

from __future__ import annotations

from minidist.parallel.config import ParallelConfig
from minidist.parallel.context.context_parallel import LAYOUTS, METHODS
from minidist.parallel.pipeline.schedule_walk import check_schedule
from minidist.parallel.pipeline.schedules import ALIASES, make_schedule
from minidist.parallel.tensor.tensor_parallel_model import check_divisible


def check_layout(cfg, pc: ParallelConfig, global_batch: int) -> None:
    """Raise ValueError if ``pc`` cannot train ``cfg`` (a GPTConfig) with ``global_batch`` sequences."""
    if global_batch < pc.dp * pc.microbatches:
        raise ValueError(f"parallel.train: global_batch={global_batch} cannot give every one of dp={pc.dp} ranks "
                         f"{pc.microbatches} micro-batch(es) of at least one sequence")
    if pc.pp > 1:
        _pipeline(cfg, pc)
    if pc.compression is not None and cfg.n_experts:
        raise ValueError(f"parallel.train: gradient compression ({type(pc.compression).__name__}) with a "
                         f"mixture-of-experts model (n_experts={cfg.n_experts}) is not built yet: the compressors "
                         "sit on DDP's reducer, and MoE reduces expert and dense gradients over two groups")
    if cfg.dropout:
        raise ValueError(f"parallel.train: dropout must be 0 (random masks would differ between layouts), "
                         f"got {cfg.dropout}")
    if pc.tp > 1 or pc.sequence_parallel:
        check_divisible(cfg, pc.tp, pc.sequence_parallel)
    _attention(cfg, pc)
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
    schedule = make_schedule(name, config.pp, config.microbatches, v)
    if n_layers < config.pp * schedule.virtual:
        raise ValueError(f"parallel.train: pp={config.pp} x {schedule.virtual} chunks per rank ({schedule.name}) "
                         f"need at least that many layers, the model has n_layers={n_layers}")
    return check_schedule(schedule)


def _pipeline(cfg, pc) -> None:
    build_schedule(pc, cfg.n_layers)


def _attention(cfg, pc) -> None:
    """Attention variants the parallel attention code does not implement (book ch. 31a)."""
    if getattr(cfg, "window", None) is not None and pc.cp > 1:
        # the cores context parallelism installs would silently drop the window
        raise ValueError(f"parallel.train: sliding-window attention (window={cfg.window}) does not compose with "
                         f"cp={pc.cp}: ring and Ulysses attention implement the full causal mask only")
    if getattr(cfg, "kv_latent", None) is not None and (pc.tp > 1 or pc.sequence_parallel):
        raise ValueError(f"parallel.train: latent attention (kv_latent={cfg.kv_latent}) does not compose with "
                         f"tensor parallelism (tp={pc.tp}, sequence_parallel={pc.sequence_parallel}): it splits "
                         "wq, wk, wv by heads, and the latent's down-projection w_dkv, shared by every head, "
                         "has no tensor-parallel version")


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
    if pc.cp > 1:
        pieces = pc.cp * (2 if pc.cp_layout == "zigzag" else 1)
        if cfg.seq_len % pieces:
            raise ValueError(f"parallel.train: seq_len={cfg.seq_len} must split into {pieces} equal chunks "
                             f"(cp={pc.cp}, cp_layout={pc.cp_layout!r})")
        if pc.sequence_parallel and (cfg.seq_len // pc.cp) % pc.tp:
            # sequence parallelism cuts each cp rank's positions once more over tp
            raise ValueError(f"parallel.train: sequence_parallel splits each cp rank's seq_len / cp = "
                             f"{cfg.seq_len} / {pc.cp} = {cfg.seq_len // pc.cp} positions over tp={pc.tp}: they "
                             f"must divide evenly")
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


def check_shape_only(cfg, pc: ParallelConfig, global_batch: int, shape_only: bool, representatives: bool,
                     backend: str, needs_values: bool) -> None:
    """What a run without values cannot do: checkpoint, restart, scale losses (each reads values), route tokens
    by score; representatives stand for ranks only in a shape-only run in this process (the others have no values
    to send: ``options.Backend`` checks it), and for expert-parallel ranks only when every rank's experts receive the
    same rows."""
    if shape_only and needs_values:
        raise ValueError("parallel.train: shape_only=True runs without values, so it cannot checkpoint, restart "
                         "or scale losses (each depends on the values)")
    if shape_only and getattr(cfg, "n_experts", 0) and getattr(cfg, "expert_load", None) is None:
        raise ValueError("parallel.train: shape_only=True runs without values, so it cannot route tokens to experts "
                         "by the router's scores; give GPTConfig(expert_load='balanced') or each expert's share")
    if representatives and pc.ep > 1 and getattr(cfg, "n_experts", 0):
        # a plan routes by the token's index in its global micro-batch, so each run of consecutive tokens a rank
        # holds (its rows of a micro-batch with cp = 1, else each cp chunk of a sequence) must deal every expert alike
        parts = pc.dp * pc.ep * pc.microbatches
        run = global_batch // parts * cfg.seq_len if pc.cp == 1 else \
            cfg.seq_len // (pc.cp * (2 if pc.cp_layout == "zigzag" else 1))
        tokens = run * cfg.top_k
        if cfg.expert_load != "balanced" or global_batch % parts or tokens % cfg.n_experts:
            raise ValueError(
                f"parallel.train: representatives=True stands for ep ranks only when every rank's experts receive "
                f"the same rows: expert_load='balanced' with {cfg.top_k} x the tokens of each run of consecutive "
                f"positions a rank holds (its rows, or each cp chunk) divisible by n_experts={cfg.n_experts} (got "
                f"expert_load={cfg.expert_load!r}, {tokens} assignments per run); run every rank "
                f"(representatives=False) for an uneven load")
