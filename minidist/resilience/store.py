"""Sharded, atomic checkpoints on disk (chapter 26, lab 17).

A checkpoint of step ``k`` is a directory ``step_00000k/`` holding one file per rank, written by that
rank in parallel (no gather to one writer), and a ``manifest.json`` written last. The manifest lists
every rank file with its size and SHA-256, the step, the layout and the state that is the same on every
rank (the data stream's generator, the losses so far). The consistency invariant of the chapter - model,
optimizer, data position and random state all of the same step - holds because everything is taken at
one step boundary, after the optimizer step, on every rank.

Atomicity: files are written into a hidden ``.step_00000k.tmp`` directory; only once every rank has
written (a barrier) does rank 0 hash the files, write the manifest and rename the directory, which the
file system does at once. A crash at any earlier moment leaves a temporary directory that nobody reads,
and the previous checkpoint intact. On load the newest checkpoint whose manifest and checksums agree is
used; a truncated or altered file is reported by name and rank, and the one before is tried.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, truncated or altered (the message names the file and rank)."""


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step:08d}"


def _tmp_dir(root: Path, step: int) -> Path:
    return Path(root) / f".step_{step:08d}.tmp"


def _rank_file(rank: int) -> str:
    return f"rank_{rank:05d}.npz"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_rank(root: Path, step: int, rank: int, arrays: dict[str, np.ndarray], meta: dict) -> int:
    """Write one rank's share of step ``step`` into the temporary directory; returns the bytes written."""
    tmp = _tmp_dir(root, step)
    tmp.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    data = buf.getbuffer()
    path = tmp / _rank_file(rank)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return len(data)


def commit(root: Path, step: int, world_size: int, shared: dict, keep: int = 2) -> Path:
    """Rank 0, after every rank wrote: hash the files, write the manifest, publish the directory at once,
    and delete all but the ``keep`` newest checkpoints."""
    root, tmp = Path(root), _tmp_dir(root, step)
    files = {}
    for r in range(world_size):
        path = tmp / _rank_file(r)
        if not path.exists():
            raise CheckpointError(f"checkpoint step {step}: rank {r} wrote no file ({path})")
        files[_rank_file(r)] = {"rank": r, "bytes": path.stat().st_size, "sha256": _sha256(path)}
    manifest = {"step": step, "world_size": world_size, "files": files, **shared}
    with open(tmp / "manifest.json", "w") as f:
        json.dump(manifest, f)
        f.flush()
        os.fsync(f.fileno())
    final = step_dir(root, step)
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    for old in committed(root)[:-keep]:
        shutil.rmtree(step_dir(root, old), ignore_errors=True)
    return final


def committed(root: Path) -> list[int]:
    """Steps of the published checkpoints under ``root``, oldest first (temporary directories ignored)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in root.iterdir() if p.is_dir() and p.name.startswith("step_")
                  and p.name[5:].isdigit())


def read(root: Path, step: int) -> tuple[dict, list[tuple[dict[str, np.ndarray], dict]]]:
    """The manifest and every rank's ``(arrays, meta)`` of step ``step``, all checked against the manifest.

    Raises CheckpointError naming the file and rank that is missing, truncated or altered."""
    d = step_dir(root, step)
    try:
        manifest = json.loads((d / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint step {step}: unreadable manifest {d / 'manifest.json'} ({e})") from e
    ranks = []
    for name, info in sorted(manifest["files"].items(), key=lambda kv: kv[1]["rank"]):
        path, r = d / name, info["rank"]
        if not path.exists():
            raise CheckpointError(f"checkpoint step {step}: the file of rank {r} is missing ({path})")
        size = path.stat().st_size
        if size != info["bytes"]:
            raise CheckpointError(f"checkpoint step {step}: the file of rank {r} is truncated or grown ({path}: "
                                  f"{size} bytes, the manifest says {info['bytes']})")
        if _sha256(path) != info["sha256"]:
            raise CheckpointError(f"checkpoint step {step}: the file of rank {r} is corrupted ({path}: its "
                                  f"SHA-256 differs from the manifest's)")
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files if k != "__meta__"}
            meta = json.loads(bytes(z["__meta__"]).decode())
        ranks.append((arrays, meta))
    return manifest, ranks


def latest(root: Path, warn=print) -> tuple[dict, list] | None:
    """The newest checkpoint under ``root`` that reads back intact (``read``'s result), or None if there is
    none; each unusable one is reported through ``warn`` and skipped."""
    for step in reversed(committed(root)):
        try:
            return read(root, step)
        except CheckpointError as e:
            warn(f"{e}; using an earlier checkpoint")
    return None


class AsyncWriter:
    """Write a rank's file in a background thread: the step only waits for the copy out of its arrays."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, *args) -> None:
        self.wait()

        def run():
            try:
                write_rank(*args)
            except BaseException as e:  # reported by wait(), in the rank's own thread
                self._error = e

        self._thread = threading.Thread(target=run, name="checkpoint-writer", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Block until the last write is on disk; re-raise its error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err
