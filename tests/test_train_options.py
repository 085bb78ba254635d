"""``md.parallel.train``'s options, one object per concern: each checks itself as it is made, with the messages train
gave for its keywords; the old keywords still train the same run, bitwise, and warn once each; the result's fields
grouped by concern."""

import math
import warnings

import numpy as np
import pytest

import minidist as md
from minidist.parallel import SGD, AdamW, Backend, ParallelConfig, Precision, Resilience, train
from minidist.parallel import options as options_module
from minidist.resilience import Faults

TINY = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=1, n_heads=2)


@pytest.mark.parametrize("make, match", [
    (lambda: AdamW(lr=math.nan), r"parallel.train: lr must be a finite number >= 0, got nan"),
    (lambda: AdamW(lr=-1.0), "lr must be a finite number >= 0"),
    (lambda: AdamW(eps=math.inf), "eps must be a finite number >= 0"),
    (lambda: AdamW(weight_decay="0.1"), "weight_decay must be a finite number >= 0"),
    (lambda: AdamW(betas=(0.9, 1.0)), r"betas must be two numbers in \[0, 1\), got \(0.9, 1.0\)"),
    (lambda: AdamW(betas=(0.9,)), "betas must be two numbers"),
    (lambda: SGD(momentum=-0.5), "momentum must be a finite number >= 0"),
    (lambda: SGD(lr=math.nan), "lr must be a finite number >= 0"),
    (lambda: Precision("fp4"), "precision must be None or one of"),
    (lambda: Precision(loss_scale=1024.0), "loss_scale needs a low precision"),
    (lambda: Precision("fp16", loss_scale=-1.0), "loss_scale must be None, 'dynamic' or a positive number"),
    (lambda: Resilience("ckpt", resume="yes"), "resume must be True, False or 'or-start-over', got 'yes'"),
    (lambda: Resilience(resume=True), "resume=True needs checkpoint_dir"),
    (lambda: Resilience(every=2), "checkpoints need checkpoint_dir"),
    (lambda: Resilience("ckpt", every=0), "checkpoints need checkpoint_dir .* got 'ckpt' and 0"),
    (lambda: Resilience(max_restarts=-1), "max_restarts must be an int >= 0"),
    (lambda: Resilience(faults="kill"), "faults must be an md.resilience.Faults"),
    (lambda: Backend("gpu"), "backend must be 'sim' .*, 'mpi' or 'inprocess', got 'gpu'"),
    (lambda: Backend("inprocess", representatives=True), "representatives=True needs shape_only=True"),
    (lambda: Backend("sim", shape_only=True, representatives=True), "representatives=True needs .*'inprocess'"),
])
def test_each_options_object_checks_itself_as_it_is_made(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_the_objects_are_frozen_and_keep_their_values():
    opt = AdamW(lr=3e-3, betas=[0.8, 0.9])
    assert opt.betas == (0.8, 0.9) and opt.hyper() == {"lr": 3e-3, "weight_decay": 0.0, "betas": (0.8, 0.9),
                                                       "eps": 1e-8}
    assert SGD(lr=0.1).hyper() == {"lr": 0.1, "weight_decay": 0.0, "momentum": 0.9}
    with pytest.raises(AttributeError):
        opt.lr = 1.0
    plan = Resilience("ckpt", every=3, async_=True).plan()
    assert (plan.root, plan.every, plan.async_) == ("ckpt", 3, True) and Resilience().plan() is None


def _same(a, b) -> None:
    assert a.losses == b.losses and a.time == b.time and a.comm_bytes == b.comm_bytes
    assert a.params.keys() == b.params.keys()
    assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(options_module, "_warned", set())


def test_the_old_keywords_train_the_same_run_and_warn_once_each(tmp_path, fresh_warnings):
    pc = ParallelConfig(dp=2)
    common = dict(steps=2, global_batch=4)
    new = train(TINY, pc, **common, optimizer=SGD(lr=0.05, momentum=0.5), precision=Precision("bf16"),
                resilience=Resilience(tmp_path / "new", every=1), backend=Backend("inprocess", timeout=60))
    old_kw = dict(optimizer="sgd", lr=0.05, momentum=0.5, precision="bf16", checkpoint_dir=tmp_path / "old",
                  checkpoint_every=1, backend="inprocess", timeout=60)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = train(TINY, pc, **common, **old_kw)
        again = train(TINY, pc, **common, **{**old_kw, "checkpoint_dir": tmp_path / "again"})
    _same(new, old)
    _same(new, again)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(messages) == 6, messages  # lr, momentum, precision, checkpoint_dir, checkpoint_every, timeout: once
    assert all(w.filename == __file__ for w in caught)  # pointed at the caller
    named = {m.split("(")[1].split("=")[0]: m for m in messages}
    assert set(named) == {"lr", "momentum", "precision", "checkpoint_dir", "checkpoint_every", "timeout"}
    assert "optimizer=md.parallel.AdamW(...) or SGD(...)" in named["lr"]
    assert "precision=md.parallel.Precision(...) (its field 'format')" in named["precision"]
    assert "resilience=md.parallel.Resilience(...) (its field 'every')" in named["checkpoint_every"]


def test_old_shape_only_and_adamw_keywords_match_the_new_form(fresh_warnings):
    pc = ParallelConfig(dp=2)
    new = train(TINY, pc, steps=1, global_batch=4, optimizer=AdamW(lr=3e-3, weight_decay=0.1, betas=(0.8, 0.99)),
                backend=Backend("inprocess", shape_only=True, representatives=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = train(TINY, pc, steps=1, global_batch=4, lr=3e-3, weight_decay=0.1, betas=(0.8, 0.99),
                    backend="inprocess", shape_only=True, representatives=True)
        plain = train(TINY, steps=1, global_batch=4, optimizer=AdamW(lr=3e-3, eps=1e-6), backend="inprocess")
        legacy = train(TINY, steps=1, global_batch=4, lr=3e-3, eps=1e-6, backend="inprocess")
    assert new.time == old.time and new.peak_memory == old.peak_memory and new.shape_only and old.shape_only
    _same(plain, legacy)
    warned = [str(w.message).split("(")[1].split("=")[0] for w in caught]
    assert warned == ["lr", "weight_decay", "betas", "shape_only", "representatives", "eps"]  # lr: once


def test_names_stand_for_defaults_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        a = train(TINY, steps=1, global_batch=4, optimizer="sgd", backend="inprocess")
        b = train(TINY, steps=1, global_batch=4, optimizer=SGD(), backend=Backend("inprocess"))
    _same(a, b)


def test_old_and_new_forms_of_one_concern_cannot_be_mixed(fresh_warnings):
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="give optimizer= or the old keywords"):
        train(TINY, optimizer=AdamW(), lr=0.1)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="give resilience= or the old keywords"):
        train(TINY, resilience=Resilience(), restart=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'learning_rate'"):
        train(TINY, learning_rate=0.1)
    with pytest.raises(ValueError, match="optimizer must be 'adamw' or 'sgd'"):
        train(TINY, optimizer="adam")
    with pytest.raises(ValueError, match="resilience must be an md.parallel.Resilience"):
        train(TINY, resilience={"checkpoint_dir": "x"})
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="momentum must be a finite number"):
        train(TINY, momentum=-1.0)  # ignored by AdamW, as before, but still checked


def test_faults_and_restarts_are_still_checked_against_the_run():
    with pytest.raises(ValueError, match="outside the 2 ranks"):
        train(TINY, ParallelConfig(dp=2), resilience=Resilience(faults=Faults(slow={3: 2.0})))
    with pytest.raises(ValueError, match="cannot checkpoint, restart"):
        train(TINY, resilience=Resilience(restart=True), backend=Backend("inprocess", shape_only=True))


def test_the_result_groups_its_fields_by_concern(tmp_path):
    r = train(TINY, ParallelConfig(dp=2), steps=2, global_batch=4, precision=Precision("fp16"),
              resilience=Resilience(tmp_path, every=1), backend="inprocess")
    t = r.training
    assert t.losses == r.losses and t.params is r.params and t.grads is r.grads and t.num_params == r.num_params
    assert t.loss_scales == r.loss_scales and len(t.loss_scales) == 2 and t.skipped_steps == r.skipped_steps
    assert r.timing.step == r.time and r.timing.windows == r.windows and r.timing.total == r.total_time
    assert r.timing.trace is r.trace and r.communication.trace is r.trace
    m = r.memory_use
    assert m.peak_by_category == r.memory and m.peak == r.peak_memory and m.timeline == r.memory_timeline
    assert m.state_bytes == r.state_bytes == {"params": 2, "grads": 2, "optimizer": 12}
    assert r.communication.bytes == r.comm_bytes and len(r.comm_bytes) == 2
    assert r.resilience.failures == [] and r.resilience.lost_time == 0.0
    assert r.resilience.checkpoint_blocked == r.checkpoint_blocked and all(b > 0 for b in r.checkpoint_blocked)
    with pytest.raises(AttributeError):
        r.timing.step = []
