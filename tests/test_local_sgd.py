"""Local SGD and DiLoCo: replicas that meet every H steps send 1/H of data parallelism's bytes, DiLoCo's outer
Nesterov step is the published rule, and on the toy GPT DiLoCo with H = 50 ends within 5% of synchronous
training's loss."""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
from minidist.parallel import AdamW, DiLoCo, LocalSGD, ParallelConfig, evaluate, train, train_local

CFG = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2)
TOKENS = md.data.load_tokens(20_000)[0] % 48


def test_replicas_that_meet_every_h_steps_send_one_h_th_of_the_bytes():
    steps, p = 100, 2
    sync = train(CFG, ParallelConfig(dp=p, bucket_bytes=1e9, algorithm="ring"), steps=steps, global_batch=16,
                 data=TOKENS)
    for h in (10, 50):
        local = train_local(CFG, p, LocalSGD(h), steps, 8, data=TOKENS)
        assert local.rounds == steps // h
        assert local.bytes_sent == [sum(s[r] for s in sync.comm_bytes) / h for r in range(p)]
        assert len(local.drift) == local.rounds and all(d > 0 for d in local.drift)  # they did drift apart


def test_outer_steps_follow_the_published_rules():
    theta, delta = np.array([1.0, 2.0]), np.array([0.5, -1.0])
    assert np.array_equal(LocalSGD(4).outer_step(theta, delta, np.zeros(2)), theta - delta)  # plain averaging
    v = np.array([0.2, 0.2])
    new = DiLoCo(4).outer_step(theta, delta, v)  # v <- 0.9 v + delta; theta -= 0.7 (delta + 0.9 v)
    assert np.allclose(v, [0.68, -0.82]) and np.allclose(new, theta - 0.7 * (delta + 0.9 * np.array([0.68, -0.82])))


def test_local_sgd_with_one_step_and_one_replica_is_plain_training():
    local = train_local(CFG, 1, LocalSGD(1), 5, 8, optimizer="sgd", lr=0.1, data=TOKENS)
    model = md.GPT(md.GPTConfig(**{**CFG.__dict__, "dtype": "float64"}), seed=0)
    opt = md.optim.SGD(model.parameters(), lr=0.1)
    for x, y in md.data.batches(TOKENS, 8, CFG.seq_len, seed=17, steps=5):
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
    assert all(np.allclose(local.params[n], q.data, atol=1e-12) for n, q in model.named_parameters())


def test_the_clock_of_every_step_is_kept_and_threads_give_the_same_run():
    """``times[s]``: a step's compute, plus one all-reduce at the end of each round (and of the run); threads run the
    same replicas to the same weights and clock."""
    procs = train_local(CFG, 2, LocalSGD(4), 10, 4, data=TOKENS)
    threads = train_local(CFG, 2, LocalSGD(4), 10, 4, data=TOKENS, backend="inprocess")
    step, sync = procs.times[0], procs.times[3] - procs.times[2] - procs.times[0]
    n = np.arange(1, 11)
    assert np.allclose(procs.times, n * step + (n // 4 + (n == 10)) * sync) and procs.times[-1] == procs.time
    assert threads.times == procs.times and all(np.array_equal(threads.params[k], v) for k, v in procs.params.items())


@pytest.mark.slow
def test_diloco_every_50_steps_reaches_synchronous_loss_with_50x_fewer_bytes():
    steps, p = 1000, 2
    sync = train(CFG, ParallelConfig(dp=p, bucket_bytes=1e9, algorithm="ring"), steps=steps, global_batch=16,
                 optimizer=AdamW(lr=3e-3), data=TOKENS)
    diloco = train_local(CFG, p, DiLoCo(50), steps, 8, lr=3e-3, data=TOKENS)
    base, mine = evaluate(CFG, sync.params, data=TOKENS), evaluate(CFG, diloco.params, data=TOKENS)
    assert mine < base * 1.05, (mine, base)
    assert sum(s[0] for s in sync.comm_bytes) == 50 * diloco.bytes_sent[0]


def test_bad_arguments_are_named():
    for bad in (lambda: LocalSGD(0), lambda: LocalSGD(5, outer_lr=0), lambda: LocalSGD(5, outer_momentum=1.0)):
        with pytest.raises(ValueError, match="LocalSGD"):
            bad()
    with pytest.raises(ValueError, match="optimizer must be"):
        train_local(CFG, 2, LocalSGD(5), 10, optimizer="lion")
