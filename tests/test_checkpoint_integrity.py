"""Checkpoints never load anything unverified (chapter 26, lab 17).

The manifest carries the SHA-256 of its own content: a flipped bit, an edited step or a dropped file entry is
named and skipped like a damaged rank file, and the next older intact checkpoint is used. ``resume=True`` with
checkpoints and none intact is an error naming each (``resume="or-start-over"`` starts over instead), a
checkpoint at or past ``steps`` is an error, and a failed write names its file and leaves nothing behind.
"""

from __future__ import annotations

import errno
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import minidist as md
from minidist.parallel import ParallelConfig, Resilience
from minidist.resilience import CheckpointError, committed, latest, read, seal, store
from minidist.resilience.store import DIGEST, manifest_digest, write_rank

DENSE = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2)
DP2 = ParallelConfig(dp=2)


def _checkpoints(root, steps: int = 3, **kw):
    return md.parallel.train(DENSE, DP2, steps=steps, global_batch=4, resilience=Resilience(root, every=1), **kw)


def _manifest_path(root, step: int) -> Path:
    return Path(root) / f"step_{step:08d}" / "manifest.json"


def _flip_rng_bit(text: str) -> str:
    """The lowest bit of the last digit of the generator's state: still valid JSON, another random stream."""
    start = text.index('"state": {"state": ')
    at = text.index(",", start) - 1
    return text[:at] + chr(ord(text[at]) ^ 1) + text[at + 1:]


def _edit(manifest: dict, change, reseal: bool) -> dict:
    change(manifest)
    if reseal:  # a consistent-looking forgery: the checksum matches, the content still has to
        manifest[DIGEST] = manifest_digest(manifest)
    return manifest


def _resume(root, steps: int = 5, **kw):
    # pytest.warns hands back the warnings it does not match, so pyproject's filter of the fork warning would not apply
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="multiprocess.popen_fork")
    return md.parallel.train(DENSE, DP2, steps=steps, global_batch=4, resilience=Resilience(root, resume=True), **kw)


def _bitwise(a, b) -> bool:
    return a.losses == b.losses and all(np.array_equal(a.params[k], b.params[k]) for k in b.params)


DAMAGE = {
    "flipped-rng-bit": (lambda text: _flip_rng_bit(text), "SHA-256 differs"),
    "edited-step": (lambda text: json.dumps(_edit(json.loads(text), lambda m: m.update(step=4), False)),
                    "SHA-256 differs"),
    "edited-step-resealed": (lambda text: json.dumps(_edit(json.loads(text), lambda m: m.update(step=4), True)),
                             "does not describe step 3: step 4"),
    "dropped-file": (lambda text: json.dumps(_edit(json.loads(text), lambda m: m["files"].pop("rank_00001.npz"),
                                                   False)), "SHA-256 differs"),
    "dropped-file-resealed": (lambda text: json.dumps(_edit(json.loads(text),
                                                            lambda m: m["files"].pop("rank_00001.npz"), True)),
                              r"lists the files of ranks \[0\], not one per rank of 2"),
    "empty": (lambda text: "{}", "has no checksum"),
    "not-json": (lambda text: text[: len(text) // 2], "unreadable"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_manifest_is_named_and_the_previous_checkpoint_is_used(damage, tmp_path):
    _checkpoints(tmp_path)
    path = _manifest_path(tmp_path, 3)
    alter, why = DAMAGE[damage]
    path.write_text(alter(path.read_text()))
    with pytest.raises(CheckpointError, match=f"step 3: the manifest {re.escape(str(path))}.* {why}"):
        read(tmp_path, 3)
    with pytest.warns(UserWarning, match=f"manifest {re.escape(str(path))}.*; using the checkpoint of step 2"):
        manifest, _ = latest(tmp_path, warn=lambda m: warnings.warn(m, stacklevel=2))
    assert manifest["step"] == 2


def test_resuming_past_a_damaged_manifest_ends_where_the_uninterrupted_run_ends(tmp_path):
    _checkpoints(tmp_path)
    path = _manifest_path(tmp_path, 3)
    path.write_text(_flip_rng_bit(path.read_text()))  # loaded, it would resume another data stream
    with pytest.warns(UserWarning, match="manifest"):
        got = _resume(tmp_path)
    assert _bitwise(got, md.parallel.train(DENSE, DP2, steps=5, global_batch=4))
    assert len(got.losses) == 5


def test_no_flipped_bit_of_a_manifest_is_loaded_as_something_else(tmp_path, monkeypatch):
    _checkpoints(tmp_path, steps=1)
    good = _manifest_path(tmp_path, 1).read_bytes()
    bad = bytearray(good)
    # the store reads the manifest through read_text: hand it the flipped bytes without a file written each time
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **kw: bytes(bad).decode(*a, **kw))
    loaded = 0
    for i in range(len(good)):
        for bit in range(8):
            bad[:] = good
            bad[i] ^= 1 << bit
            try:
                manifest, _ = read(tmp_path, 1)
            except CheckpointError:
                continue
            # the only flips that pass change nothing JSON reads (an exponent's e to E): the same content
            assert manifest == json.loads(good), (i, bit)
            loaded += 1
    assert loaded <= 2


def test_a_manifest_from_before_checksums_is_refused_until_sealed(tmp_path):
    _checkpoints(tmp_path)
    for step in (2, 3):
        path = _manifest_path(tmp_path, step)
        old = json.loads(path.read_text())
        del old[DIGEST]
        path.write_text(json.dumps(old))
    with pytest.raises(CheckpointError, match=r"step 3: .*has no checksum.*md\.resilience\.seal\("):
        read(tmp_path, 3)
    with pytest.raises(CheckpointError, match="no intact checkpoint in .*step 3.*step 2"):
        latest(tmp_path)
    assert seal(tmp_path, 3) == _manifest_path(tmp_path, 3)
    assert read(tmp_path, 3)[0]["step"] == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the sealed one is the newest: nothing skipped
        got = _resume(tmp_path, steps=4)
    assert _bitwise(got, md.parallel.train(DENSE, DP2, steps=4, global_batch=4))
    # a seal vouches for the manifest as it is, and only if its files agree with it
    victim = Path(tmp_path) / "step_00000002" / "rank_00001.npz"
    victim.write_bytes(victim.read_bytes()[:-1])
    with pytest.raises(CheckpointError, match="rank 1 is truncated"):
        seal(tmp_path, 2)
    assert DIGEST not in json.loads(_manifest_path(tmp_path, 2).read_text())


def test_with_every_checkpoint_unusable_resume_refuses_unless_told_to_start_over(tmp_path):
    _checkpoints(tmp_path)
    for step in (2, 3):
        path = _manifest_path(tmp_path, step)
        path.write_text(_flip_rng_bit(path.read_text()))
    with pytest.raises(CheckpointError, match=f"no intact checkpoint in {re.escape(str(tmp_path))}: checkpoint step 3"
                                              f": .*checkpoint step 2: .*resume='or-start-over'"):
        _resume(tmp_path)
    assert committed(tmp_path) == [2, 3]  # refused, nothing moved
    with pytest.warns(UserWarning, match="starting over from step 0.*step_00000003.unusable"):
        got = md.parallel.train(DENSE, DP2, steps=2, global_batch=4,
                                resilience=Resilience(tmp_path, every=1, resume="or-start-over"))
    assert _bitwise(got, md.parallel.train(DENSE, DP2, steps=2, global_batch=4))
    # the broken ones are kept for inspection, out of the way: the new run's checkpoints are not pruned for them
    assert committed(tmp_path) == [1, 2]
    assert sorted(p.name for p in Path(tmp_path).glob("*.unusable")) == ["step_00000002.unusable",
                                                                          "step_00000003.unusable"]


def test_resume_in_an_empty_or_missing_directory_starts_from_step_0(tmp_path):
    ref = md.parallel.train(DENSE, DP2, steps=2, global_batch=4)
    assert _bitwise(_resume(tmp_path / "missing", steps=2), ref)
    with pytest.raises(ValueError, match="resume must be True, False or 'or-start-over', got 'yes'"):
        md.parallel.train(DENSE, DP2, steps=2, global_batch=4, resilience=Resilience(tmp_path, resume="yes"))


@pytest.mark.parametrize("steps", [2, 3])
def test_resuming_a_checkpoint_at_or_past_steps_is_a_clear_error(steps, tmp_path):
    _checkpoints(tmp_path)
    with pytest.raises(ValueError, match=f"in {re.escape(str(tmp_path))} is of step 3, at or past steps={steps}"):
        _resume(tmp_path, steps=steps)


class _FullDisk:
    """``open`` for the checkpoint store, on a disk that fills up halfway through the file of rank ``rank``."""

    def __init__(self, rank: int) -> None:
        self.name = f"rank_{rank:05d}.npz"

    def __call__(self, path, mode="r", *args, **kw):
        f = open(path, mode, *args, **kw)
        if Path(path).name != self.name:
            return f
        real = f.write

        def write(data):
            real(bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        f.write = write
        return f


def test_a_failed_write_names_its_file_and_directory_and_leaves_no_partial_file(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "open", _FullDisk(0), raising=False)
    where = re.escape(str(tmp_path / ".step_00000005.tmp"))
    with pytest.raises(OSError, match=rf"checkpoint step 5, rank 0: could not write rank_00000\.npz in {where} "
                                      r"\(No space left on device\)") as err:
        write_rank(tmp_path, 5, 0, {"w": np.zeros(1000)}, {})
    assert err.value.errno == errno.ENOSPC
    assert not (tmp_path / ".step_00000005.tmp" / "rank_00000.npz").exists()


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
def test_a_run_whose_checkpoint_write_fails_says_where_and_removes_its_tmp(async_, tmp_path, monkeypatch):
    # in process, so that the patched store is the ranks' store whatever the start method
    _checkpoints(tmp_path, steps=2, backend="inprocess")
    monkeypatch.setattr(store, "open", _FullDisk(1), raising=False)
    with pytest.raises(md.RankError, match=r"could not write rank_00001\.npz in .*\.step_00000003\.tmp.*No space"):
        md.parallel.train(DENSE, DP2, steps=4, global_batch=4,
                          resilience=Resilience(tmp_path, every=1, async_=async_, resume=True), backend="inprocess")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001", "step_00000002"]  # no .tmp left
    assert latest(tmp_path)[0]["step"] == 2
