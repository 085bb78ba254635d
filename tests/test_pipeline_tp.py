"""Pipeline parallelism with tensor parallelism inside each stage (chapters 15-16 and 23, labs 10 and 15).

* tp = 2 with and without sequence parallelism, pp in {2, 4}, every schedule (ZB-H1 included):
  losses, gradients and weights after 2 AdamW steps equal the single-device run (float64). The
  full product (2 x 3 x 4 x 2 = 48 launches) is too slow for the suite; the subset below covers
  every schedule at m = 4 on both pipeline depths, with and without SP; m in {1, 8} for 1F1B (both
  depths) and ZB-H1 (with SP); dp = 2 x tp = 2 x pp = 2 for 1F1B and ZB-H1 + SP; and a measured
  stage balance with uneven micro-batches (tp = 2 + SP);
* stage boundaries: tp rank r of a stage only talks to tp rank r of the next; without SP each tp rank
  sends the whole activation, with SP its sequence shard (half of it at tp = 2);
* the split backward defers the column- and row-parallel weight gradients to the W pass, whose work
  is then local (no collective), and gives the ordinary backward's gradients;
* with uniform stage costs on free links the tp = 2 pipeline's executed bubble is the schedule's.
"""

import numpy as np
import pytest

import minidist as md
from minidist.parallel import ParallelConfig, train
from minidist.parallel.pipeline.executor import PipelineExecutor
from minidist.parallel.pipeline.schedule_walk import simulate
from minidist.parallel.pipeline.schedules import bubble_fraction, make_schedule
from minidist.parallel.pipeline.split_backward import WeightGradStore
from minidist.parallel.pipeline.stages import stage_layout
from minidist.parallel.tensor.tensor_parallel import TPGroup
from minidist.parallel.tensor.tensor_parallel_model import tensor_parallelize
from tests.test_pipeline import BATCH, SCHEDULES, SMALL, STEPS, assert_same, config_for, single_device

V = dict(SCHEDULES)  # virtual stages of each schedule
CASES = (
    [(s, pp, 4, False, 1) for s in V for pp in (2, 4)]
    + [(s, pp, 4, True, 1) for s in V for pp in (2, 4)]
    + [("1f1b", pp, m, False, 1) for pp in (2, 4) for m in (1, 8)]
    + [("zb-h1", pp, m, True, 1) for pp in (2, 4) for m in (1, 8)]
    + [("1f1b", 2, 4, False, 2), ("zb-h1", 2, 4, True, 2)]
)


def _case(s, pp, m, sp, dp):
    marks = [pytest.mark.slow] if m != 4 else []  # the micro-batch extremes run in make test-slow
    return pytest.param(s, pp, m, sp, dp, id=f"{s}-pp{pp}-m{m}{'-sp' if sp else ''}-dp{dp}", marks=marks)


@pytest.mark.parametrize("schedule, pp, m, sp, dp", [_case(*c) for c in CASES])
def test_pipeline_with_tensor_parallel_matches_single_device(schedule, pp, m, sp, dp):
    pc = ParallelConfig(pp=pp, tp=2, dp=dp, microbatches=m, schedule=schedule, virtual_stages=V[schedule],
                        sequence_parallel=sp)
    cfg = config_for(pp, V[schedule])
    oracle = single_device(cfg)
    res = train(cfg, pc, steps=STEPS, global_batch=BATCH)
    assert_same(res, oracle)
    if dp == 2:  # both replicas hold the same (merged) weights
        assert len(res.rank_params) == 2
        for name, ref in oracle.params.items():
            np.testing.assert_allclose(res.rank_params[1][name], ref, rtol=1e-10, atol=1e-12, err_msg=name)
    # the ledger holds each stage's tp blocks only: over all ranks, dp x (tp copies of one rank's share)
    share = tensor_parallelize(md.GPT(cfg, seed=0), TPGroup(size=2, rank=0, sequence_parallel=sp))
    want = dp * 2 * 8 * sum(p.data.size for _, p in share.named_parameters())  # float64
    assert sum(mem["params"] for mem in res.memory) == pytest.approx(want)
    assert max(mem["params"] for mem in res.memory) < 1.5 * want / (dp * 2 * pp)
    assert res.num_params == sum(p.size for p in oracle.params.values())


@pytest.mark.parametrize("sp", [False, True], ids=["full-activation", "sequence-shard"])
def test_stage_boundary_traffic(sp):
    """Rank = 4 pp + 2 dp + tp: a message between stages stays on one (dp, tp) position and carries a
    micro-batch's (rows, T, d) activation, or its (rows, T/2, d) sequence shard with SP (the closed
    form's per-GPU message with tp = 2); each of the dp x tp pipelines moves 2 (p-1) m of them."""
    pp, m = 2, 4
    pc = ParallelConfig(pp=pp, dp=2, tp=2, microbatches=m, sequence_parallel=sp)
    res = train(SMALL, pc, steps=1, global_batch=BATCH)
    rows = BATCH // 2 // m
    message = md.estimate.pp_activation_bytes(rows, SMALL.seq_len, SMALL.d_model, 8, tp=2 if sp else 1)
    crossing = []
    for e in res.trace:
        if e.stream == "link" and e.nbytes > 0:
            src, dst = (int(r) for r in e.name.split("->"))
            if src // 4 != dst // 4:
                crossing.append((src, dst, e.nbytes))
    assert crossing and all(s % 4 == d % 4 and n == message for s, d, n in crossing)
    assert sum(n for *_, n in crossing) == 2 * 2 * md.estimate.pp_comm_bytes_total(message, pp, m)


def _split_backward_on_two_ranks(sp: bool):
    cfg = md.GPTConfig(vocab_size=32, seq_len=8, d_model=16, n_layers=2, n_heads=2, dtype="float64")
    x = np.random.default_rng(0).integers(0, 32, (3, 8))

    def fn():
        from minidist.parallel.tensor.tensor_parallel import TPGroup
        from minidist.parallel.tensor.tensor_parallel_model import tensor_parallelize
        from minidist.runtime.context import current

        tp = TPGroup.of(None, sequence_parallel=sp)
        ref = tensor_parallelize(md.GPT(cfg, seed=0), tp)
        ref(x, x)[1].backward()
        model = tensor_parallelize(md.GPT(cfg, seed=0), tp)
        store = WeightGradStore()
        store.split(*model.blocks, model.lm_head)
        events = current("test").clock.recorder.events
        n0 = len(events)
        with store.capture("mb0"):
            model(x, x)[1].backward()
        during_i = [e for e in events[n0:] if e[0] == "comm"]
        deferred = sorted(n for n, p in model.named_parameters() if p.grad is None)
        stash = store.stash_bytes("mb0")
        n1 = len(events)
        store.flush("mb0")
        during_w = [e for e in events[n1:] if e[0] == "comm"]
        got = {n: p.grad for n, p in model.named_parameters()}
        want = {n: p.grad for n, p in ref.named_parameters()}
        return deferred, stash, len(during_i), len(during_w), got, want, dict(store.pending)

    return md.launch(fn, world_size=2)


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_split_backward_defers_tensor_parallel_weight_grads(sp):
    for deferred, stash, n_comm_i, n_comm_w, got, want, pending in _split_backward_on_two_ranks(sp):
        # every column- and row-parallel weight waits for W; the column biases too (row biases are
        # replicated and, with SP, reduced with the norms: they stay in I)
        matrices = [f"blocks.{i}.{m}.weight" for i in (0, 1) for m in ("attn.wq", "attn.wk", "attn.wv", "attn.wo",
                                                                          "mlp.fc1", "mlp.fc2")]
        assert set(matrices + ["lm_head.weight"]) <= set(deferred)
        assert not any(n.startswith(("wte", "wpe", "ln_f")) or ".ln" in n for n in deferred)
        assert stash > 0 and n_comm_i > 0 and n_comm_w == 0 and not pending
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-15, err_msg=name)


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_executed_bubble_with_tensor_parallel_stages(schedule):
    """Uniform stage costs on free links: both tp ranks of every stage follow the schedule's timeline."""
    p, m, tp = 2, 4, 2
    tokens, _ = md.data.load_tokens(2_000, seed=0)
    x, y = md.data.get_batch(tokens, m, SMALL.seq_len, np.random.default_rng(0))
    cfg = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=4, n_heads=2, dtype="float64")
    unit = {"F": 1e-3, "I": 1e-3, "W": 1e-3}

    def fn():
        from minidist.parallel.mesh import build_mesh
        from minidist.parallel.tensor.tensor_parallel import TPGroup
        from minidist.parallel.tensor.tensor_parallel_model import tensor_parallelize

        mesh = build_mesh(ParallelConfig(pp=p, tp=tp))
        pp_ranks = list(mesh.get_group("pp").ranks)
        tpg = TPGroup(mesh.get_group("tp"), tp, mesh.get_local_rank("tp"), True)
        model = tensor_parallelize(md.GPT(cfg, seed=0), tpg)
        ex = PipelineExecutor(model, pp_ranks, mesh.get_local_rank("pp"), stage_layout(4, p), unit_costs=unit)
        return ex.run(make_schedule(schedule, p, m), [x[i:i + 1] for i in range(m)], [y[i:i + 1] for i in range(m)],
                      [1 / m] * m)

    res = md.launch(fn, world_size=p * tp, cluster=md.Cluster.uniform(alpha=0.0, beta=float("inf")))
    want = bubble_fraction(simulate(make_schedule(schedule, p, m), F=1e-3))
    assert bubble_fraction(res.trace) == pytest.approx(want, abs=1e-9)
    assert want == pytest.approx(md.estimate.pipeline_bubble(p, m, schedule))
    got = sorted((e.rank, e.name, round(e.start, 12)) for e in res.trace if e.stream == "pipeline")
    sim = sorted((e.rank, e.name, round(e.start, 12)) for e in simulate(make_schedule(schedule, p, m), F=1e-3)
                 if e.stream == "pipeline")
    stage_of = {r: r // tp for r in range(p * tp)}  # rank 2s + t plays stage s
    assert sorted((stage_of[r], n, t) for r, n, t in got) == sorted(
        [(s, n, t) for s, n, t in sim for _ in range(tp)])


def test_measured_balance_and_uneven_micro_batches_with_tensor_parallel():
    """Stages cut by the dense blocks' measured cost (a heavy head), 7 sequences in 3 micro-batches, tp = 2 + SP."""
    cfg = md.GPTConfig(vocab_size=400, seq_len=8, d_model=16, n_layers=4, n_heads=2)
    ref = train(cfg, ParallelConfig(), steps=2, global_batch=7)
    pc = ParallelConfig(pp=2, tp=2, microbatches=3, pp_balance="measured", sequence_parallel=True)
    assert_same(train(cfg, pc, steps=2, global_batch=7), ref)
