"""``md.parallel.train``: train a GPT under any layout and measure it (every lab from 08 on).

The same function is the experiment and its oracle. ``ParallelConfig()`` (one device) is plain
training; any other layout must give the same loss every step, the same gradients and the same
weights, while its simulated time, memory ledger and traffic show what the layout costs. Every rank
runs the same loop: build the model from the seed, ``parallelize`` it (the one place that applies the
strategies), then per step take its share of the batch, run the micro-batches, step the optimizer on
what it owns. Each micro-batch's loss is scaled by its share of the global batch, so the summed
gradient is the gradient of the global mean loss whatever the split.
"""

from __future__ import annotations

import numbers
from contextlib import nullcontext
from dataclasses import replace

import numpy as np

from minidist import dist
from minidist.autograd.shape_only import building
from minidist.data import get_batch, load_tokens
from minidist.hardware.cluster import Cluster
from minidist.nn import GPT, update_route_bias
from minidist.parallel.checkpointing import Attempt
from minidist.parallel.config import ParallelConfig
from minidist.parallel.data.flat_optim import FlatOptimizer
from minidist.parallel.mesh import DENSE_GRAD, build_mesh
from minidist.parallel.mesh import representatives as mesh_representatives
from minidist.parallel.mixed_precision import MixedPrecision, unscale_and_agree
from minidist.parallel.options import SGD, AdamW, Backend, Precision, Resilience, options
from minidist.parallel.parallelize import parallelize, split_sizes
from minidist.parallel.pipeline.stages import layer_costs
from minidist.parallel.rank_state import gather_state
from minidist.parallel.refusals import check_layout, check_shape_only
from minidist.parallel.restart import Attempts, after_setup, step_loss, step_times
from minidist.parallel.result import TrainResult
from minidist.parallel.tensor.tensor_parallel_model import merge_tensor_parallel
from minidist.runtime import launch
from minidist.runtime.context import current


def _rank_train(model_config, pc: ParallelConfig, steps: int, global_batch: int, seed: int, optimizer: str,
                hyper: dict, tokens: np.ndarray, run: Attempt | None = None, mp: MixedPrecision | None = None,
                shapes: bool = False) -> dict:
    """One rank of every layout: build the model, ``parallelize`` it, train it. The same loop for all.

    ``run`` (checkpoints, faults, a state to resume from) makes it one attempt of a resilient run; ``shapes``
    builds the model shape-only (``autograd/shape_only.py``): the same charges, no values."""
    mesh = build_mesh(pc)
    clock = current("md.parallel.train").clock
    with building() if shapes else nullcontext():
        model = GPT(model_config, seed=seed)
    num_params = model.num_parameters()
    costs = None
    if pc.pp > 1 and pc.pp_balance == "measured":  # cut the stages by each block's measured cost
        largest = split_sizes(split_sizes(global_batch, pc.dp)[0], pc.microbatches)[0]
        x, y = get_batch(tokens, largest, model_config.seq_len, np.random.default_rng([seed, 3]))
        costs = layer_costs(model, x, y)
    opt = FlatOptimizer(optimizer, **hyper)
    mp = mp or MixedPrecision()
    clock.wire_scale = mp.wire_scale(model_config.dtype)
    par = parallelize(model, mesh, pc, opt, mp.state_bytes(model_config.dtype, optimizer), costs)
    scaler = mp.scaler()
    reducer = par.reducer
    rng = np.random.default_rng([seed, 2])
    run = run or Attempt()
    keeper = run.checkpointer(par, opt, mesh, clock, scaler)
    start = run.resume(par, opt, mesh, rng, clock, scaler)
    losses, windows, synced, grads = [], [], [], None  # synced: the steps right after a checkpoint
    lead = mesh.get_local_rank("tp") == 0
    keeper.start(start, run.shared(rng, pc), {"losses": [], "windows": [], "synced": [], "lead": lead})
    step = start
    while step < steps:
        keeper.before_step(step)
        batch = get_batch(tokens, global_batch, model_config.seq_len, rng) if not shapes else \
            (np.broadcast_to(np.int64(0), (global_batch, model_config.seq_len)),) * 2  # no tokens held
        xs, ys, weights = par.batch.split(*batch)
        t0 = dist.now()
        scale = scaler.scale if scaler is not None else 1.0  # the loss scale rides on the micro-batch weights
        with mp.context():
            losses.append(par.engine.run(xs, ys, [w * scale for w in weights]) / scale)
        pieces = reducer.pieces()
        stepping = scaler is None or unscale_and_agree(pieces, scaler)
        if step == steps - 1:
            grads = reducer.grad_state()
        skip = reducer.skipped(par.model) if hasattr(reducer, "skipped") else frozenset()  # experts no token reached
        if not stepping:
            pass  # a gradient overflowed somewhere: every rank skips this update
        elif par.host is not None:
            par.host.step(pieces, skip)
        else:
            opt.step_on_device(pieces, model_config.dtype, skip)
        reducer.after_step(par.model)
        update_route_bias(par.model)  # auxiliary-loss-free MoE balancing: the biases move after each step
        clock.join(clock.end())
        windows.append((t0, dist.now()))
        if keeper.after_step(step):  # a failure survived in place: back to the newest checkpoint
            step = keeper.rollback(par, opt, rng)
            del losses[step - start:], windows[step - start:]
            synced = [s for s in synced if s < len(windows)]
            continue
        step += 1
        dist.progress(step, steps, "step")
        if keeper.due(step):
            keeper.save(step, run.shared(rng, pc), {"losses": list(losses), "windows": list(windows),
                                                    "synced": list(synced), "lead": lead})
            synced.append(len(windows))  # the next step: timed from when the last rank left the checkpoint
    keeper.finish()
    return {"losses": losses, "windows": windows, "synced": synced, "grads": None if shapes else grads,
            "params": None if shapes else reducer.param_state(),
            "host": None if par.host is None else dict(par.host.ledger.peak),
            "acts": [] if par.acts is None else par.acts.log, "num_params": num_params,
            "tp_rank": mesh.get_local_rank("tp"), "dp_rank": mesh.get_group(DENSE_GRAD).group_rank(mesh.rank),
            "tp_axes": par.tp_axes, "blocked": keeper.blocked, "start": start, "end": clock.end(),
            "failures": getattr(keeper, "failures", []), "lost": getattr(keeper, "lost", 0.0),
            "scales": [] if scaler is None else scaler.history, "skipped": 0 if scaler is None else scaler.skipped,
            **par.report}


def train(model_config, parallel: ParallelConfig | None = None, steps: int = 1, global_batch: int = 8, *,
          optimizer: AdamW | SGD | str = "adamw", precision: Precision | None = None,
          resilience: Resilience | None = None, backend: Backend | str = "sim", seed: int = 0, cluster=None,
          dtype: str = "float64", data=None, **old) -> TrainResult:
    """Train ``GPT(model_config, seed)`` for ``steps`` optimizer steps of ``global_batch`` sequences.

    ``parallel`` lays the step out on ``parallel.world_size`` simulated devices (default: one); a layout
    or estimate from ``md.estimate.plan`` is accepted too (``ParallelConfig.from_layout``).
    ``data``: a 1-D array of token ids (default: the package's toy corpus); batches are drawn from it
    with a generator seeded by ``seed``, identically for every layout. ``optimizer``: ``md.parallel.AdamW(lr=...)``
    (PyTorch's AdamW) or ``md.parallel.SGD(lr=..., momentum=...)``; ``"adamw"`` and ``"sgd"`` name their defaults. Runs
    ``md.launch`` and returns a :class:`TrainResult`. One object per concern (``parallel/options.py``), each checked
    when made; the old keywords (``lr=``, ``checkpoint_dir=``, ``precision="bf16"``, ``shape_only=``, ...) still work
    for this release and warn once each (``DeprecationWarning``).

    ``resilience=md.parallel.Resilience(...)`` (chapter 26): ``checkpoint_dir`` and ``every`` write a sharded
    checkpoint every that many steps (``async_``: in the background); ``resume=True`` starts from the newest intact
    checkpoint there, whatever layout wrote it, skipping damaged ones with a warning (each manifest carries its own
    SHA-256 and lists its files' SHA-256s: nothing unverified is loaded; ``md.resilience.seal`` vouches for one
    written before manifests had a checksum). With no checkpoint there yet (an empty or missing directory) it starts
    from step 0, so one call both starts a job and resumes it; if there are checkpoints and none is intact it raises
    ``CheckpointError`` naming each, unless ``resume="or-start-over"``, which sets them aside and starts from step 0.
    A checkpoint at or past ``steps`` is an error (nothing is left to train), not a no-op. ``faults``
    (``md.resilience.Faults``) kills ranks or slows them; with ``restart=True`` a failed attempt restarts from the
    newest intact checkpoint (or from the start without one), at most ``max_restarts`` times, and the result counts
    the simulated time lost. A failed attempt is an injected fault or a rank process that really died (``os._exit``,
    SIGKILL; its lost time is not known and counts as none); a rank that raises is an error and is raised. The
    checkpoint holds the weights, the optimizer's moments, the data order, the loss scaler and the routing biases,
    so a resumed or restarted run equals the uninterrupted one.

    ``precision=md.parallel.Precision(format, loss_scale)`` (chapter 30): ``format`` ("bf16", "fp16", "fp8") runs
    the matrix products in that format over an fp32 master copy (``md.precision.autocast``), books 2 + 2 + 12 bytes
    per parameter and charges each op the format's bytes and peak (``mixed_precision.CHARGES``); ``loss_scale``
    (default dynamic for fp16) scales the loss, and a step any rank's gradient overflowed is skipped by all
    (``loss_scales``, ``skipped_steps`` in the result).

    ``backend=md.parallel.Backend(name, shape_only, representatives, timeout)`` or its name: ``"mpi"`` runs the
    ranks under ``mpiexec`` (``md.launch``): the same losses and weights, bitwise; ``"inprocess"`` runs them as
    threads of this process taking turns, bitwise the same too.

    ``shape_only=True`` trains a model whose arrays have shapes and no values (``md.autograd.shape_only``): every
    op, message and booking is charged as with data, so ``time`` and the memory fields are those of the real run,
    while ``losses`` are NaN and ``params``/``grads`` empty. With ``representatives=True`` (shape-only, in process)
    only one rank per pipeline stage (and ring-attention context rank) runs and stands for the ranks that differ
    from it in dp, ep or tp, and cp under Ulysses (``parallel.mesh.representatives``): thousands of ranks in seconds
    (when dp x ep does not divide ``global_batch`` the shares differ, and every dp and ep coordinate runs).
    """
    pc = ParallelConfig() if parallel is None else parallel
    if not isinstance(pc, ParallelConfig) and hasattr(getattr(pc, "layout", pc), "zero_stage"):
        pc = ParallelConfig.from_layout(pc)  # a layout of md.estimate.plan runs as is
    if not isinstance(pc, ParallelConfig):
        raise TypeError(f"parallel.train: parallel must be a ParallelConfig (or an md.estimate Layout/Estimate), "
                        f"got {type(pc).__name__}")
    for name, value in (("steps", steps), ("global_batch", global_batch), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < (0 if name == "seed" else 1):
            raise ValueError(f"parallel.train: {name} must be an int >= {0 if name == 'seed' else 1}, got {value!r}")
    opt, prec, res_opts, back = options(optimizer, precision, resilience, backend, old)
    mp, faults, backend = prec.mixed(), res_opts.faults, back.name
    cfg = replace(model_config, dtype=dtype)
    check_layout(cfg, pc, global_batch)
    tokens = load_tokens(20_000, seed=0)[0] if data is None else np.asarray(data, dtype=np.int64).reshape(-1)
    if tokens.max() >= cfg.vocab_size:
        raise ValueError(f"parallel.train: the data holds token id {int(tokens.max())} but vocab_size is "
                         f"{cfg.vocab_size}")
    cluster = Cluster() if cluster is None else cluster
    plan = res_opts.plan()
    if pc.algorithm == "native" and backend != "mpi":
        raise ValueError("parallel.train: algorithm='native' runs MPI's own collectives: it needs backend='mpi'")
    if backend == "mpi" and (faults is not None or res_opts.restart):
        raise ValueError("parallel.train: faults and restarts are simulated on the shared-memory backend only "
                         "(backend='sim')")
    if faults is not None:
        faults.check(pc.world_size)
    check_shape_only(cfg, pc, global_batch, back.shape_only, back.representatives, backend,
                     (faults is not None and not faults.timing_only) or res_opts.restart or plan is not None
                     or mp.scaler() is not None)
    represent = mesh_representatives(pc, global_batch).__getitem__ if back.representatives else None
    attempts = Attempts(plan, faults, res_opts.restart, res_opts.max_restarts, res_opts.resume, steps)
    res = attempts.run(lambda attempt: launch(
        _rank_train, world_size=pc.world_size, args=(cfg, pc, steps, global_batch, seed, opt.name, opt.hyper(), tokens,
                                                     attempt, mp, bool(back.shape_only)),
        cluster=cluster, timeout=back.timeout, backend=backend, represent=represent))
    out = list(res)
    start = out[0]["start"]
    lead = [o for o in out if o.get("tp_rank", 0) == 0]  # tensor-parallel peers report the same loss
    ran = steps - start  # an attempt that resumed ran the last steps only
    losses = attempts.losses + [step_loss(o["losses"][s] for o in lead) for s in range(ran)]
    windows = [o["windows"] for o in out]  # the bytes of each rank's own step, from its own start (below)
    synced = out[0]["synced"]  # the steps after a checkpoint, timed from when the last rank left it
    time = attempts.times + step_times(windows, ran, synced)  # the first from the end of the last rank's setup
    rep = getattr(res, "representatives", None) or list(range(len(out)))  # a rank's trace is its representative's
    per_rep = {r: res.trace.bytes_within(r, windows[r][:ran]) for r in set(rep)}
    comm = [[per_rep[rep[r]][s] for r in range(len(out))] for s in range(ran)]
    aligned = after_setup(windows, synced)
    # an early rank's wait, after a checkpoint, for the last to leave it: the checkpoint's time, not the next step's
    blocked = [o["blocked"] + sum(aligned[r][s][0] - windows[r][s][0] for s in synced if s < len(windows[r]))
               for r, o in enumerate(out)]
    windows = aligned
    if back.shape_only:
        params, grads, rank_params = {}, {}, None
    else:
        replicated = "full" in out[0]["params"]
        params = gather_state(out[0]["params"], [o["params"] for o in out])
        grads = gather_state(out[0]["grads"], [o["grads"] for o in out])
        rank_params = [o["params"]["full"] for o in out] if replicated else None
        if pc.tp > 1:
            params, grads, rank_params = merge_tensor_parallel(out, gather_state, replicated)
    return TrainResult(
        losses=losses, params=params, grads=grads, time=time,
        memory=[dict(m.peak) for m in res.memory], peak_memory=[m.peak_total for m in res.memory], trace=res.trace,
        peak_breakdown=[dict(m.peak_breakdown) for m in res.memory],
        memory_timeline=[list(m.timeline) for m in res.memory], comm_bytes=comm,
        host_memory=[o["host"] for o in out if o["host"] is not None],
        rank_params=rank_params,
        activations=out[0]["acts"], state_bytes=mp.state_bytes(dtype, opt.name),
        num_params=out[0]["num_params"], windows=windows,
        total_time=attempts.elapsed + max(o["end"] for o in out), failures=attempts.failures + out[0]["failures"],
        lost_time=attempts.lost + out[0]["lost"], checkpoint_blocked=blocked,
        loss_scales=out[0]["scales"], skipped_steps=out[0]["skipped"], shape_only=bool(back.shape_only))
