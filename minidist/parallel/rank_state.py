"""A rank's share of the training state, named in the model's own coordinates (chapter 26, lab 17).

A checkpoint must outlive the layout that wrote it. Whatever a rank holds - whole parameters, a slice
of a flat ZeRO bucket, an FSDP unit's shard, a tensor-parallel block of a matrix, one pipeline stage,
some experts - is a set of element ranges of named parameters, and the optimizer state is elementwise,
so it lives in exactly the same ranges. :func:`capture` writes a rank's weights and optimizer state as
such ranges; :func:`merge` puts the ranks' ranges back together into whole tensors (concatenating
tensor-parallel blocks along their split axis, the "TP 8 -> 4 is concatenating pairs" of the chapter);
:func:`restore` cuts whole tensors again for whatever layout the rank now has. Because only copies are
involved, a state that goes through ``capture``, ``merge`` and ``restore`` comes back bitwise.
"""

from __future__ import annotations

import numpy as np

from minidist.parallel.data.flat import assemble

MOMENTS = {"adamw": ("m", "v"), "sgd": ("momentum_buffer",)}


def capture(reducer, optimizer, model, tp_axes: dict | None, tp_rank: int, tp_size: int
            ) -> tuple[dict[str, np.ndarray], dict]:
    """This rank's weights and optimizer state as named element ranges: ``(arrays, meta)``.

    ``arrays`` holds one flat copy per range and kind (``w`` weights, then the optimizer's moments);
    ``meta`` says which parameter and elements each range is, with the local shapes and the
    tensor-parallel split (``tp_axes``: name -> axis or None; None without tensor parallelism)."""
    kinds = ("w",) + MOMENTS[optimizer.kind]
    state = optimizer.state
    shapes = {n: tuple(p.data.shape) for n, p in model.named_parameters()}
    arrays, segments = {}, []
    for i, ((w, _), layout) in enumerate(zip(reducer.pieces(), reducer.piece_layout())):
        st = state[i] if state else None
        for name, lo, hi, at in layout:
            key = str(len(segments))
            for kind in kinds:
                source = w if kind == "w" else (None if st is None else st[kind])
                arrays[kind + key] = (np.zeros(hi - lo, w.dtype) if source is None
                                      else source.reshape(-1)[at:at + hi - lo].copy())
            segments.append({"name": name, "lo": lo, "hi": hi, "step": 0 if st is None else int(st["step"])})
    names = {s["name"] for s in segments}
    meta = {"segments": segments, "shapes": {n: shapes[n] for n in names}, "optimizer": optimizer.kind,
            "tp_axes": {n: (tp_axes or {}).get(n) for n in names}, "tp_rank": tp_rank, "tp_size": tp_size}
    return arrays, meta


def merge(ranks: list[tuple[dict[str, np.ndarray], dict]]) -> dict[str, dict]:
    """Whole tensors from every rank's :func:`capture`: ``{name: {"w": ..., moment: ..., "step": int}}``.

    Raises ValueError naming the parameter if some of its elements are held by no rank, or if two ranks
    disagree on its step count."""
    kinds = ("w",) + MOMENTS[ranks[0][1]["optimizer"]]
    local: dict[tuple[str, int], dict] = {}
    steps: dict[str, int] = {}
    axes, sizes = {}, {}
    for arrays, meta in ranks:
        for idx, seg in enumerate(meta["segments"]):
            name = seg["name"]
            axis = meta["tp_axes"].get(name)
            axes[name], sizes[name] = axis, (meta["tp_size"] if axis is not None else 1)
            part = meta["tp_rank"] if axis is not None else 0
            shape = tuple(meta["shapes"][name])
            buf = local.setdefault((name, part), {"shape": shape, "seen": np.zeros(int(np.prod(shape)), bool)})
            for kind in kinds:
                a = arrays[kind + str(idx)]
                buf.setdefault(kind, np.empty(buf["seen"].size, a.dtype))[seg["lo"]:seg["hi"]] = a
            buf["seen"][seg["lo"]:seg["hi"]] = True
            if steps.setdefault(name, seg["step"]) != seg["step"]:
                raise ValueError(f"checkpoint: ranks disagree on the step count of {name!r} "
                                 f"({steps[name]} and {seg['step']})")
    out = {}
    for name in sorted(steps):
        parts = [local.get((name, r)) for r in range(sizes[name])]
        missing = [r for r, b in enumerate(parts) if b is None or not b["seen"].all()]
        if missing:
            raise ValueError(f"checkpoint: no rank holds all of {name!r} (tensor-parallel part(s) {missing} "
                             f"incomplete): the checkpoint is missing a rank's file")
        whole = {kind: [b[kind].reshape(b["shape"]) for b in parts] for kind in kinds}
        axis = axes[name]
        out[name] = {kind: (v[0] if axis is None else np.concatenate(v, axis=axis)) for kind, v in whole.items()}
        out[name]["step"] = steps[name]
    return out


def restore(reducer, optimizer, model, full: dict[str, dict], tp_axes: dict | None, tp_rank: int,
            tp_size: int) -> None:
    """Set this rank's weights and optimizer state from whole tensors (:func:`merge`'s result), cut for
    the rank's current layout. Raises ValueError naming what the checkpoint lacks or mis-shapes."""
    kinds = MOMENTS[optimizer.kind]
    stored = next(iter(full.values()))
    if any(k not in stored for k in kinds):
        raise ValueError(f"checkpoint: it holds {sorted(k for k in stored if k not in ('w', 'step'))} optimizer "
                         f"state; this run's {optimizer.kind} needs {list(kinds)}")
    cache: dict[tuple[str, str], np.ndarray] = {}

    def local(name: str, kind: str) -> np.ndarray:
        if (name, kind) not in cache:
            if name not in full:
                raise ValueError(f"checkpoint: no parameter {name!r} in it (a different model?)")
            a = full[name][kind]
            axis = (tp_axes or {}).get(name)
            cache[name, kind] = np.ascontiguousarray(a if axis is None else np.split(a, tp_size, axis=axis)[tp_rank])
        return cache[name, kind]

    held = {n for names in reducer.piece_names() for n in names}  # every parameter of this rank's buckets
    for name, p in model.named_parameters():
        if p.data.flags.writeable and name in held:
            if local(name, "w").shape != p.data.shape:
                raise ValueError(f"checkpoint: {name!r} has shape {local(name, 'w').shape} here, the model "
                                 f"{p.data.shape}")
            p.data[...] = local(name, "w")  # whole weights (replicated layouts, ZeRO-1/2's full buffers)
    pieces, layouts = reducer.pieces(), reducer.piece_layout()
    optimizer.state = [optimizer._new(w) for w, _ in pieces]
    for (w, _), layout, st in zip(pieces, layouts, optimizer.state):
        for name, lo, hi, at in layout:
            w.reshape(-1)[at:at + hi - lo] = local(name, "w").reshape(-1)[lo:hi]  # shards (ZeRO-3/FSDP)
            for kind in kinds:
                st[kind].reshape(-1)[at:at + hi - lo] = local(name, kind).reshape(-1)[lo:hi]
            st["step"] = full[name]["step"]


def capture_loop(model, scaler, reducer) -> dict:
    """What the step loop carries besides weights and moments, JSON-ready: the routing biases of each bias-balanced
    MoE layer this rank runs (``{module name: biases}``, a statistic of past loads, no parameter) and the dynamic
    loss scaler's state (the same on every rank), so that a resumed run routes and scales as the run it continues."""
    held = {n for names in reducer.piece_names() for n in names}
    biases = {name: m.route_bias.tolist() for name, m in model.named_modules()
              if getattr(m, "balance", None) == "bias" and f"{name}.router.weight" in held}
    return {"route_bias": biases, "scaler": None if scaler is None else scaler.state_dict()}


def merge_loop(metas: list[dict]) -> dict:
    """Every rank's :func:`capture_loop` as one: each layer's biases from whichever rank ran it (pipeline stages
    hold some layers each), the scaler's state from the first rank. A checkpoint written before these were saved
    gives none."""
    biases: dict[str, list] = {}
    for meta in metas:
        biases.update(meta.get("route_bias", {}))
    return {"route_bias": biases, "scaler": metas[0].get("scaler")}


def restore_loop(model, scaler, state: dict | None) -> None:
    """Set the routing biases and the loss scaler from :func:`merge_loop`'s result (``None``: nothing saved)."""
    if not state:
        return
    biases = state.get("route_bias", {})
    for name, m in model.named_modules():
        if name in biases:
            m.route_bias = np.array(biases[name], dtype=np.float64)
    if scaler is not None and state.get("scaler") is not None:
        scaler.load_state_dict(state["scaler"])


def gather_state(st: dict, per_rank: list[dict]) -> dict[str, np.ndarray]:
    """The whole tensors of a run's result from every rank's ``reducer.param_state()`` (or ``grad_state()``)."""
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
