"""One rank of ``md.parallel.train`` when ``pp > 1``: a pipeline stage inside a data-parallel replica
(chapters 16 and 23; lab 10).

The rank builds the whole GPT from the seed (every rank draws the same weights) and keeps the
blocks of its virtual stages (:func:`~minidist.parallel.pipeline.stage_layout`, even or balanced
by measured cost). Its parameters form a DDP replica over the ``dp`` axis: the schedule runs all
micro-batches with gradient synchronisation off, then the buckets are all-reduced once the
pipeline has flushed, and every stage applies the optimizer to its own parameters. The step's loss
is computed on the last stage; the trainer sums the ranks' shares.

With ``tp > 1`` (chapters 15 and 23) each stage is a tensor-parallel group: every rank keeps its
1/t block of its stage's matrices (``tensor_parallelize``) and the ``pp`` group it sends to is the
one of its own tp index, so tp rank ``r`` of stage s talks only to tp rank ``r`` of stages s +- 1.
Without sequence parallelism every tp rank holds the whole (B, T, d) activation after each block's
all-reduce and sends all of it: the stage boundary carries ``t`` copies of the activation (Megatron's
scatter/gather optimisation would send 1/t each and all-gather on arrival; not done here). With
sequence parallelism the activation between blocks is already the rank's (B, T/t, d) sequence shard,
and that shard is what crosses the boundary, so the boundary carries one activation in all (as in
Megatron with ``sequence_parallel``). Every schedule runs unchanged, ZB-H1 included: the
column- and row-parallel matmuls defer their weight gradients to the W pass like a dense Linear.
"""

from __future__ import annotations

import numpy as np

from minidist.parallel.schedules import ALIASES, check_schedule, make_schedule


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


def check_pipeline(model_config, pc) -> None:
    """Reject, before any process starts, a pipeline layout this trainer cannot run."""
    if pc.shards_params or pc.offload is not None or pc.ep > 1:
        raise ValueError("parallel.train: pp > 1 composes with dp (DDP, ZeRO-1, ZeRO-2), tp (with or without "
                         "sequence parallelism), cp and recompute for now; ZeRO-3, FSDP, offload and ep with "
                         "pipelining are not implemented yet")
    if model_config.tie_embeddings:
        raise ValueError("parallel.train: tie_embeddings=True puts one matrix on the first and the last pipeline "
                         "stage; untie it for pp > 1")
    if getattr(model_config, "n_experts", 0):
        raise ValueError("parallel.train: pp > 1 with a mixture-of-experts model is not implemented yet (the "
                         "pipeline's last stage computes the plain cross-entropy, without the router's losses)")
    build_schedule(pc, model_config.n_layers)


def rank_train(model_config, pc, steps: int, global_batch: int, seed: int, optimizer: str, hyper: dict,
               tokens: np.ndarray, balance: str = "even") -> dict:
    from minidist import dist
    from minidist.data import get_batch
    from minidist.nn import GPT
    from minidist.parallel.context_parallel import CPGroup, context_parallelize
    from minidist.parallel.data_parallel import DataParallel
    from minidist.parallel.flat_optim import FlatOptimizer
    from minidist.parallel.memory import state_bytes_per_param
    from minidist.parallel.mesh import DENSE_GRAD, build_mesh
    from minidist.parallel.pipeline import PipelineExecutor, layer_costs, stage_layout
    from minidist.parallel.recompute import selective_core
    from minidist.parallel.train import split_sizes
    from minidist.parallel.zero import ZeroOptimizer
    from minidist.runtime.context import current

    check_pipeline(model_config, pc)
    mesh = build_mesh(pc)
    group, dp, dp_rank = mesh.get_group("dp"), pc.dp, mesh.get_local_rank("dp")
    ledger = dist.memory()
    clock = current("md.parallel.train").clock
    model = GPT(model_config, seed=seed)
    schedule = build_schedule(pc, model_config.n_layers)
    v = schedule.virtual
    rng = np.random.default_rng([seed, 2])
    part = mesh.get_local_rank("dp")  # this rank's share of the batch's sequences (cp splits positions instead)
    rows = split_sizes(global_batch, pc.dp)
    lo = sum(rows[:part])
    mb_rows = split_sizes(rows[part], pc.microbatches)
    costs = None
    if balance == "measured":
        x, y = get_batch(tokens, max(mb_rows), model_config.seq_len, np.random.default_rng([seed, 3]))
        costs = layer_costs(model, x, y)
    layout = stage_layout(model_config.n_layers, pc.pp, v, costs)  # cut the dense blocks (tp splits each evenly)
    num_params = int(sum(p.data.size for _, p in model.named_parameters()))
    tp_axes = None
    if pc.tp > 1 or pc.sequence_parallel:  # this rank's tensor-parallel share of every block (issue 7)
        from minidist.parallel.tensor_parallel import TPGroup
        from minidist.parallel.tensor_parallel_model import shard_axes, tensor_parallelize

        tpg = TPGroup(mesh.get_group("tp"), pc.tp, mesh.get_local_rank("tp"), pc.sequence_parallel, pc.algorithm)
        model = tensor_parallelize(model, tpg)
        tp_axes = shard_axes(model)  # of the whole model, so the trainer can merge every stage's blocks
    cp = None
    if pc.cp > 1:  # every stage attends across its cp group; positions are this rank's share of each sequence
        cp = CPGroup.of(mesh.get_group("cp"), pc.cp_layout, pc.algorithm)
        context_parallelize(model, cp, pc.cp_method)
        group = mesh.get_group(DENSE_GRAD)  # cp ranks hold replicas too: the gradient sums over dp x cp
        dp, dp_rank = group.size(), group.group_rank(mesh.rank)
    if pc.recompute == "selective":
        for block in model.blocks:  # wrap whichever attention core is installed (dense or tensor-parallel)
            block.attn.core = selective_core(block.attn.core, None)
    ex = PipelineExecutor(model, list(mesh.get_group("pp").ranks), mesh.get_local_rank("pp"), layout, ledger=ledger,
                          recompute_every=pc.recompute_every)
    if pc.zero_stage in (1, 2):  # the stage's optimizer state (and with 2 its gradients) sharded over dp
        strat = ZeroOptimizer(pc.zero_stage, ex.named, pc.bucket_bytes, group, dp, dp_rank, pc.algorithm)
    else:
        strat = DataParallel(ex.named, pc.bucket_bytes, group, dp, dp_rank, pc.algorithm)
    opt = FlatOptimizer(optimizer, **hyper)
    strat.setup(ledger, state_bytes_per_param(model_config.dtype, optimizer))
    losses, windows, grads = [], [], None
    for step in range(steps):
        x, y = get_batch(tokens, global_batch, model_config.seq_len, rng)
        x, y = x[lo:lo + rows[part]], y[lo:lo + rows[part]]
        if cp is not None:
            x, y = cp.shard(x), cp.shard(y)
        cuts = np.cumsum([0] + mb_rows)
        t0 = dist.now()
        with strat.no_sync():
            loss = ex.run(schedule, [x[a:b] for a, b in zip(cuts, cuts[1:])],
                          [y[a:b] for a, b in zip(cuts, cuts[1:])], [n / global_batch / pc.cp for n in mb_rows])
        strat.finish()
        if step == steps - 1:
            grads = strat.grad_state()
        pieces = strat.pieces()
        opt.step_on_device(pieces, model_config.dtype)
        strat.after_step(model)
        clock.join(clock.end())
        windows.append((t0, dist.now()))
        losses.append(loss)
    return {"losses": losses, "windows": windows, "grads": grads, "params": strat.param_state(), "host": None,
            "acts": [], "num_params": num_params,
            "layout": layout, "stage": mesh.get_local_rank("pp"), "tp_rank": mesh.get_local_rank("tp"),
            "dp_rank": dp_rank,
            "tp_axes": tp_axes}
