"""Sharded, atomic checkpoints on disk (chapter 26, lab 17).

A checkpoint of step ``k`` is a directory ``step_00000k/`` holding one file per rank, written by that
rank in parallel (no gather to one writer), and a ``manifest.json`` written last. The manifest lists
every rank file with its size and SHA-256, the step, the layout and the state that is the same on every
rank (the data stream's generator, the losses so far), and ends with ``manifest_sha256``, the SHA-256 of a
canonical JSON of everything else in it: the manifest is verified as its files are. The consistency
invariant of the chapter - model, optimizer, data position and random state all of the same step - holds
because everything is taken at one step boundary, after the optimizer step, on every rank.

Atomicity: files are written into a hidden ``.step_00000k.tmp`` directory; only once every rank has
written (a barrier) does rank 0 hash the files, write the manifest and rename the directory, which the
file system does at once. A crash at any earlier moment leaves a temporary directory that nobody reads,
and the previous checkpoint intact. On load the newest checkpoint whose manifest and checksums agree is
used; a truncated or altered file, or an altered manifest, is reported by name (and rank), and the one before
is tried. Nothing is loaded before its checksum is verified: a manifest without ``manifest_sha256`` (written
before manifests carried one) is refused too; ``seal`` adds it to one its owner trusts. Checkpoints that are
all unusable are an error of ``latest``, not "no checkpoint".

A write that fails (a full disk) raises an OSError naming the file and the checkpoint's directory, and removes
the partial file; ``discard_partial`` removes the temporary directories a failed run leaves.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

MANIFEST = "manifest.json"
DIGEST = "manifest_sha256"  # the manifest's own checksum: the last field, over all the others


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, truncated or altered (the message names the file and rank)."""


def manifest_digest(manifest: dict) -> str:
    """SHA-256 of a canonical JSON (sorted keys, no spaces) of every field but ``manifest_sha256``.

    Computed on what JSON gives back, so that the writer's numpy floats and the reader's Python floats agree."""
    body = json.loads(json.dumps({k: v for k, v in manifest.items() if k != DIGEST}))
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


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


def _write(path: Path, data, what: str) -> None:
    """Write ``data`` to ``path`` and make it durable; on failure remove the partial file and raise an OSError
    that names it and its checkpoint (``what``)."""
    try:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        path.unlink(missing_ok=True)  # a partial file is useless and may be large: never leave it behind
        reason = e.strerror or os.strerror(e.errno or errno.EIO)
        raise OSError(e.errno, f"{what}: could not write {path.name} in {path.parent} ({reason}); the partial "
                               f"file was removed, the previous checkpoints are intact", str(path)) from e


def write_rank(root: Path, step: int, rank: int, arrays: dict[str, np.ndarray], meta: dict) -> int:
    """Write one rank's share of step ``step`` into the temporary directory; returns the bytes written.

    A failed write (a full disk) raises an OSError naming the file and directory, and leaves no partial file."""
    tmp = _tmp_dir(root, step)
    tmp.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    data = buf.getbuffer()
    _write(tmp / _rank_file(rank), data, f"checkpoint step {step}, rank {rank}")
    return len(data)


def discard_partial(root: Path) -> list[Path]:
    """Remove the temporary directories of checkpoints never published under ``root`` (a failed or cut-off
    write); returns them. Only for when no rank is writing, such as after a run ended."""
    root = Path(root)
    if not root.is_dir():
        return []
    partial = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(".step_") and p.name.endswith(".tmp")]
    for p in partial:
        shutil.rmtree(p, ignore_errors=True)
    return partial


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
    manifest[DIGEST] = manifest_digest(manifest)
    _write(tmp / MANIFEST, json.dumps(manifest).encode(), f"checkpoint step {step}, manifest")
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


def _manifest(root: Path, step: int, verify: bool = True) -> dict:
    """The manifest of step ``step``, its checksum verified (``verify``) and its layout checked: a step that is its
    directory's and exactly one file for each rank ``0 .. world_size - 1``. Raises CheckpointError naming it."""
    path = step_dir(root, step) / MANIFEST
    where = f"checkpoint step {step}: the manifest {path}"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{where} is unreadable ({e})") from e
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{where} is not a JSON object (it holds a {type(manifest).__name__})")
    if verify and DIGEST not in manifest:
        raise CheckpointError(f"{where} has no checksum ({DIGEST!r}): it is damaged, or was written by a minidist "
                              f"from before manifests carried one. It is not loaded; if you trust it, "
                              f"md.resilience.seal({str(root)!r}, {step}) adds the checksum")
    if verify and manifest[DIGEST] != manifest_digest(manifest):
        raise CheckpointError(f"{where} is corrupted or was edited: its SHA-256 differs from its {DIGEST!r}")
    files, world = manifest.get("files"), manifest.get("world_size")
    if manifest.get("step") != step or not isinstance(world, int) or not isinstance(files, dict):
        raise CheckpointError(f"{where} does not describe step {step}: step {manifest.get('step')!r}, world_size "
                              f"{world!r}, files of type {type(files).__name__}")
    try:
        ranks = sorted(info["rank"] for info in files.values())
        named = all(name == _rank_file(info["rank"]) and isinstance(info["bytes"], int)
                    and isinstance(info["sha256"], str) for name, info in files.items())
    except (TypeError, KeyError, ValueError) as e:
        raise CheckpointError(f"{where} has a malformed entry in 'files' ({e!r})") from e
    if ranks != list(range(world)) or not named:
        raise CheckpointError(f"{where} lists the files of ranks {ranks}, not one per rank of {world}")
    return manifest


def _files(root: Path, step: int, manifest: dict) -> list[Path]:
    """The rank files of a checkpoint in rank order, each checked against the manifest's size and SHA-256.

    Raises CheckpointError naming the file and rank that is missing, truncated or altered."""
    d, paths = step_dir(root, step), []
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
        paths.append(path)
    return paths


def read(root: Path, step: int) -> tuple[dict, list[tuple[dict[str, np.ndarray], dict]]]:
    """The manifest and every rank's ``(arrays, meta)`` of step ``step``: the manifest checked against its own
    checksum, and every file against the manifest, before anything is loaded.

    Raises CheckpointError naming the manifest, or the file and rank, that is missing, truncated or altered."""
    manifest = _manifest(root, step)
    ranks = []
    for path in _files(root, step, manifest):
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files if k != "__meta__"}
            meta = json.loads(bytes(z["__meta__"]).decode())
        ranks.append((arrays, meta))
    return manifest, ranks


def latest(root: Path, warn: Callable[[str], object] = print) -> tuple[dict, list] | None:
    """The newest checkpoint under ``root`` that reads back intact (``read``'s result), or None if ``root`` holds
    no published checkpoint; each unusable newer one is reported through ``warn`` and skipped.

    Raises CheckpointError, naming ``root`` and what was wrong with each, when there are checkpoints and none is
    intact: that is not the same as having none."""
    problems = []
    for step in reversed(committed(root)):
        try:
            found = read(root, step)
        except CheckpointError as e:
            problems.append(str(e))
            continue
        for p in problems:
            warn(f"{p}; using the checkpoint of step {step}")
        return found
    if problems:
        raise CheckpointError(f"no intact checkpoint in {root}: " + "; ".join(problems))
    return None


def set_aside(root: Path) -> list[Path]:
    """Rename every published checkpoint under ``root`` to ``step_XXXXXXXX.unusable`` (kept for inspection, no longer
    a checkpoint): for a run that starts over where none was intact, so that its own checkpoints are not pruned in
    favour of newer broken ones. Returns the new paths."""
    moved = []
    for step in committed(root):
        d = step_dir(root, step)
        target, n = d.with_name(d.name + ".unusable"), 1
        while target.exists():  # one set aside by an earlier start over: keep both
            target, n = d.with_name(f"{d.name}.unusable{n}"), n + 1
        os.rename(d, target)
        moved.append(target)
    return moved


def seal(root: Path, step: int) -> Path:
    """Add ``manifest_sha256`` to the manifest of step ``step`` written without one (by an older minidist),
    after checking that its rank files agree with it; returns the manifest's path. For checkpoints you trust:
    it vouches for the manifest's content as it is now."""
    path = step_dir(root, step) / MANIFEST
    manifest = _manifest(root, step, verify=False)
    _files(root, step, manifest)  # the files must agree with it, or the seal would vouch for a broken checkpoint
    manifest[DIGEST] = manifest_digest(manifest)
    tmp = path.with_name(MANIFEST + ".tmp")
    _write(tmp, json.dumps(manifest).encode(), f"checkpoint step {step}, sealing the manifest")
    os.replace(tmp, path)  # at once: a crash leaves the old manifest or the sealed one
    return path


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
