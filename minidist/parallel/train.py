"""``md.parallel.train``: train a GPT under any layout and measure it (issue 6; every lab from 08 on).

The same function is the experiment and its oracle. ``ParallelConfig()`` (one device) is plain
training; any other layout must give the same loss every step, the same gradients and the same
weights, while its simulated time, memory ledger and traffic show what the layout costs. Each
micro-batch's loss is scaled by its share of the global batch (its sequences over the global
batch's), so the summed gradient is the gradient of the global mean loss whatever the split.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import numpy as np

from minidist.parallel.config import ParallelConfig
from minidist.parallel.flat import assemble
from minidist.parallel.flat_optim import FlatOptimizer
from minidist.parallel.memory import ActivationLedger, state_bytes_per_param
from minidist.parallel.mesh import build_mesh


def split_sizes(n: int, parts: int) -> list[int]:
    """``n`` items in ``parts`` nearly equal consecutive parts (the first ``n % parts`` get one more)."""
    base, extra = divmod(n, parts)
    return [base + (i < extra) for i in range(parts)]


@dataclass
class TrainResult:
    """What a run measured. ``time``: simulated seconds per step (slowest rank); ``memory[r]``: rank r's
    peak bytes per ledger category; ``comm_bytes[s][r]``: bytes rank r sent on links during step s."""

    losses: list[float]
    params: dict[str, np.ndarray]
    grads: dict[str, np.ndarray]
    time: list[float]
    memory: list[dict[str, float]]
    trace: object
    comm_bytes: list[list[float]]
    host_memory: list[dict[str, float]] = field(default_factory=list)
    rank_params: list[dict[str, np.ndarray]] | None = None  # replicated layouts: every rank's weights
    activations: dict = field(default_factory=dict)
    state_bytes: dict = field(default_factory=dict)
    num_params: int = 0
    windows: list[list[tuple[float, float]]] = field(default_factory=list)

    def __repr__(self) -> str:
        return (f"TrainResult({len(self.losses)} steps, loss {self.losses[0]:.4f} -> {self.losses[-1]:.4f}, "
                f"{np.mean(self.time) * 1e3:.4g} ms/step simulated)")


def _state(st: dict, per_rank: list[dict]) -> dict[str, np.ndarray]:
    if "full" in st:  # replicated, or (pipeline stages) each rank holds some whole parameters
        return {k: v for s in per_rank for k, v in s["full"].items()}
    # sharded: each unit's shards, from the ranks that hold it (its group, in rank order), joined unit by unit;
    # a pipeline stage's units or an expert's live on some ranks only
    units: dict[tuple, tuple[dict, list]] = {}
    for s in per_rank:
        for u in s["meta"]:
            units.setdefault((u["name"], tuple(u["names"])), (u, []))[1].append({u["name"]: s["shards"][u["name"]]})
    out = {}
    for meta, shards in units.values():
        out.update(assemble([meta], shards))
    return out


def _rank_train(model_config, parallel: ParallelConfig, steps: int, global_batch: int, seed: int, optimizer: str,
                hyper: dict, tokens: np.ndarray) -> dict:
    from minidist import dist
    from minidist.data import get_batch
    from minidist.nn import GPT
    from minidist.parallel.data_parallel import DataParallel
    from minidist.parallel.fsdp import ShardedModel
    from minidist.parallel.offload import HostOptimizer, HostParams, HostTier
    from minidist.parallel.runner import Runner
    from minidist.parallel.zero import ZeroOptimizer
    from minidist.runtime.context import current

    pc = parallel
    if pc.pp > 1:
        from minidist.parallel.pipeline_train import rank_train

        return rank_train(model_config, pc, steps, global_batch, seed, optimizer, hyper, tokens, pc.pp_balance)
    mesh = build_mesh(pc)
    group, dp, dp_rank = mesh.get_group("dp"), pc.dp, mesh.get_local_rank("dp")
    ledger = dist.memory()
    clock = current("md.parallel.train").clock
    model = GPT(model_config, seed=seed)
    num_params = model.num_parameters()
    tp_axes = None
    if pc.tp > 1 or pc.sequence_parallel:  # this rank's tensor-parallel share of the model (issue 7)
        from minidist.parallel.tensor_parallel import TPGroup
        from minidist.parallel.tensor_parallel_model import shard_axes, tensor_parallelize

        tpg = TPGroup(mesh.get_group("tp"), pc.tp, mesh.get_local_rank("tp"), pc.sequence_parallel, pc.algorithm)
        model = tensor_parallelize(model, tpg)
        tp_axes = shard_axes(model)
    plan = None
    if pc.cp > 1 or pc.ep > 1 or model_config.n_experts:  # tokens split over dp x ep x cp (issue 9)
        from minidist.parallel.cp_ep_train import TokenPlan

        plan = TokenPlan(model, mesh, pc)
        group, dp, dp_rank = plan.group, plan.size, plan.index
    named = list(model.named_parameters())
    sb = state_bytes_per_param(model_config.dtype, optimizer)
    if plan is not None and plan.has_experts:
        strat = plan.reducer(named, pc.bucket_bytes, pc.zero_stage)
    elif pc.shards_params:
        strat = ShardedModel(model, group, dp, dp_rank, fsdp=pc.fsdp, prefetch=pc.prefetch, algorithm=pc.algorithm)
    elif pc.zero_stage in (1, 2):
        strat = ZeroOptimizer(pc.zero_stage, named, pc.bucket_bytes, group, dp, dp_rank, pc.algorithm)
    else:
        strat = DataParallel(named, pc.bucket_bytes, group, dp, dp_rank, pc.algorithm)
    opt = FlatOptimizer(optimizer, **hyper)
    host = None
    if pc.offload:
        tier = HostTier(clock, dist.cluster(), dist.get_rank(), dist.get_world_size())
        if pc.offload == "optimizer+params":
            strat.host = HostParams(strat.shards, tier, clock)
        host = HostOptimizer(opt, clock, tier, sb, params_on_host=pc.offload == "optimizer+params")
    strat.setup(ledger, dict(sb, optimizer=0) if host else sb)
    if host is not None:
        host.setup(strat.pieces())
    acts = ActivationLedger(ledger)
    runner = Runner(model, pc, acts, strat if pc.shards_params else None)

    rng = np.random.default_rng([seed, 2])
    parts, part = (plan.batch_parts, plan.batch_index) if plan is not None else (dp, dp_rank)
    share = plan.loss_share if plan is not None else 1.0  # cp ranks hold 1/cp of each sequence
    rows = split_sizes(global_batch, parts)
    lo = sum(rows[:part])
    mb_rows = split_sizes(rows[part], pc.microbatches)
    losses, windows = [], []
    grads = None
    for step in range(steps):
        x, y = get_batch(tokens, global_batch, model_config.seq_len, rng)
        x, y = x[lo:lo + rows[part]], y[lo:lo + rows[part]]
        if plan is not None:
            x, y = plan.shard(x), plan.shard(y)
        t0 = dist.now()
        local, start = 0.0, 0
        for i, n in enumerate(mb_rows):
            last = i == len(mb_rows) - 1
            quiet = strat.no_sync() if (not last and strat.accumulates_locally) else nullcontext()
            with quiet:
                loss = runner.loss(x[start:start + n], y[start:start + n])
                runner.backward(loss, n / global_batch * share)
            if last or not strat.accumulates_locally:
                strat.finish()
            local += float(loss.data) * n / global_batch * share
            start += n
        if step == steps - 1:
            grads = strat.grad_state()
        pieces = strat.pieces()
        skip = strat.skipped(model) if hasattr(strat, "skipped") else frozenset()  # experts no token reached
        if host is not None:
            host.step(pieces, skip)
        else:
            opt.step_on_device(pieces, model_config.dtype, skip)
        strat.after_step(model)
        clock.join(clock.end())
        windows.append((t0, dist.now()))
        losses.append(local)
    return {"losses": losses, "windows": windows, "grads": grads, "params": strat.param_state(),
            "host": None if host is None else dict(host.ledger.peak),
            "acts": acts.log,
            "num_params": num_params, "tp_rank": mesh.get_local_rank("tp"), "dp_rank": dp_rank, "tp_axes": tp_axes}


def train(model_config, parallel: ParallelConfig | None = None, steps: int = 1, global_batch: int = 8, seed: int = 0,
          cluster=None, dtype: str = "float64", optimizer: str = "adamw", lr: float = 1e-3,
          weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
          momentum: float = 0.9, data=None, timeout: float = 120) -> TrainResult:
    """Train ``GPT(model_config, seed)`` for ``steps`` optimizer steps of ``global_batch`` sequences.

    ``parallel`` lays the step out on ``parallel.world_size`` simulated devices (default: one); a layout
    or estimate from ``md.estimate.plan`` is accepted too (``ParallelConfig.from_layout``).
    ``data``: a 1-D array of token ids (default: the package's toy corpus); batches are drawn from it
    with a generator seeded by ``seed``, identically for every layout. ``optimizer``: ``"adamw"``
    (PyTorch's AdamW) or ``"sgd"`` (with ``momentum``). Runs ``md.launch`` and returns a
    :class:`TrainResult`.
    """
    from minidist.data import load_tokens
    from minidist.hardware.cluster import Cluster
    from minidist.runtime import launch

    pc = ParallelConfig() if parallel is None else parallel
    if not isinstance(pc, ParallelConfig) and hasattr(getattr(pc, "layout", pc), "zero_stage"):
        pc = ParallelConfig.from_layout(pc)  # a layout of md.estimate.plan runs as is
    if not isinstance(pc, ParallelConfig):
        raise TypeError(f"parallel.train: parallel must be a ParallelConfig (or an md.estimate Layout/Estimate), "
                        f"got {type(pc).__name__}")
    if steps < 1:
        raise ValueError(f"parallel.train: steps must be >= 1, got {steps}")
    if global_batch < pc.dp * pc.microbatches:
        raise ValueError(f"parallel.train: global_batch={global_batch} cannot give every one of dp={pc.dp} ranks "
                         f"{pc.microbatches} micro-batch(es) of at least one sequence")
    cfg = replace(model_config, dtype=dtype)
    if pc.pp > 1:
        from minidist.parallel.pipeline_train import check_pipeline

        check_pipeline(cfg, pc)
    if cfg.dropout:
        raise ValueError(f"parallel.train: dropout must be 0 (random masks would differ between layouts), "
                         f"got {cfg.dropout}")
    if cfg.tie_embeddings and pc.shards_params:
        raise ValueError("parallel.train: tie_embeddings=True is not supported with zero_stage=3 or fsdp "
                         "(the tied matrix would belong to two units)")
    if pc.tp > 1 or pc.sequence_parallel:
        from minidist.parallel.tensor_parallel_model import check_divisible

        check_divisible(cfg, pc.tp, pc.sequence_parallel)
    if pc.cp > 1 or pc.ep > 1 or cfg.n_experts:
        from minidist.parallel.cp_ep_train import check_layout

        check_layout(cfg, pc)
        if global_batch < pc.dp * pc.ep * pc.microbatches:
            raise ValueError(f"parallel.train: global_batch={global_batch} cannot give every one of dp x ep = "
                             f"{pc.dp * pc.ep} ranks {pc.microbatches} micro-batch(es) of at least one sequence")
    tokens = load_tokens(20_000, seed=0)[0] if data is None else np.asarray(data, dtype=np.int64).reshape(-1)
    if tokens.max() >= cfg.vocab_size:
        raise ValueError(f"parallel.train: the data holds token id {int(tokens.max())} but vocab_size is "
                         f"{cfg.vocab_size}")
    hyper = {"lr": lr, "weight_decay": weight_decay}
    hyper.update({"betas": tuple(betas), "eps": eps} if optimizer == "adamw" else {"momentum": momentum})
    cluster = Cluster() if cluster is None else cluster
    res = launch(_rank_train, world_size=pc.world_size, args=(cfg, pc, steps, global_batch, seed, optimizer, hyper,
                                                             tokens), cluster=cluster, timeout=timeout)
    out = list(res)
    lead = [o for o in out if o.get("tp_rank", 0) == 0]  # tensor-parallel peers report the same loss
    losses = [float(sum(o["losses"][s] for o in lead)) for s in range(steps)]
    windows = [o["windows"] for o in out]
    time = [max(w[s][1] - w[s][0] for w in windows) for s in range(steps)]
    links = [e for e in res.trace if e.stream == "link"]
    comm = [[sum(e.nbytes for e in links if e.rank == r and windows[r][s][0] <= e.start < windows[r][s][1])
             for r in range(len(out))] for s in range(steps)]
    replicated = "full" in out[0]["params"]
    params = _state(out[0]["params"], [o["params"] for o in out])
    grads = _state(out[0]["grads"], [o["grads"] for o in out])
    rank_params = [o["params"]["full"] for o in out] if replicated else None
    if pc.tp > 1:
        from minidist.parallel.tensor_parallel_model import merge_tensor_parallel

        params, grads, rank_params = merge_tensor_parallel(out, _state, replicated)
    return TrainResult(
        losses=losses, params=params, grads=grads, time=time,
        memory=[dict(m.peak) for m in res.memory], trace=res.trace, comm_bytes=comm,
        host_memory=[o["host"] for o in out if o["host"] is not None],
        rank_params=rank_params,
        activations=out[0]["acts"], state_bytes=state_bytes_per_param(dtype, optimizer),
        num_params=out[0]["num_params"], windows=windows)
