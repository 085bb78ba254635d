"""Trace: every charge is an event; Chrome/Perfetto JSON export; a matplotlib timeline."""

import json

import numpy as np
import pytest

import minidist.dist as dist
from minidist.hardware.cluster import Cluster
from minidist.hardware.trace import Event, Trace
from minidist.runtime import launch


def _work():
    dist.compute(flops=1e12, bytes=1e6, name="matmul")
    x = np.ones(1000, np.float32)
    dist.all_reduce(x)
    return dist.now()


@pytest.fixture(scope="module")
def result():
    return launch(_work, 2, cluster=Cluster.uniform(1e-6, 1e9))


def test_every_charge_is_an_event(result):
    tr = result.trace
    assert {e.stream for e in tr} == {"compute", "comm", "link"}
    for r in (0, 1):
        mm = tr.filter(rank=r, name="matmul").events
        assert len(mm) == 1 and mm[0].flops == 1e12 and mm[0].start == 0.0
        ar = tr.filter(rank=r, stream="comm").events
        assert [e.name for e in ar] == ["all_reduce"] and ar[0].nbytes == 4000
        assert ar[0].start == pytest.approx(mm[0].end) and ar[0].end == pytest.approx(result.times[r])
    assert tr.end() == pytest.approx(max(result.times))
    assert all(isinstance(e, Event) for e in tr) and len(tr) == len(tr.events)


def test_chrome_json_export(result, tmp_path):
    path = tmp_path / "run.trace.json"
    doc = result.trace.to_chrome(str(path))
    loaded = json.loads(path.read_text())
    assert loaded == json.loads(json.dumps(doc))
    spans = [e for e in loaded["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(result.trace)
    mm = [e for e in spans if e["name"] == "matmul" and e["pid"] == 1][0]
    want = result.trace.filter(rank=1, name="matmul").events[0].duration * 1e6
    assert mm["ts"] == 0.0 and mm["dur"] == pytest.approx(want)
    names = {(e["pid"], e["args"]["name"]) for e in loaded["traceEvents"] if e["ph"] == "M"}
    assert (0, "rank 0") in names and (1, "compute") in names


def test_timeline_plot(result):
    import matplotlib

    matplotlib.use("Agg")
    ax = result.trace.plot(title="two ranks")
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["rank 0 compute", "rank 0 comm", "rank 1 compute", "rank 1 comm"]
    assert ax.get_xlabel() == "simulated time (ms)"


def test_busy_merges_overlaps():
    tr = Trace([Event(0, "comm", "a", 0.0, 2.0, 0, 0), Event(0, "comm", "b", 1.0, 3.0, 0, 0),
                Event(0, "comm", "c", 5.0, 6.0, 0, 0), Event(1, "comm", "d", 0.0, 9.0, 0, 0)])
    assert tr.busy(0, "comm") == 4.0 and tr.busy(1, "compute") == 0.0


def test_busy_within_clips_each_event_to_its_ranks_window():
    tr = Trace([Event(0, "compute", "a", 0.0, 2.0, 0, 0), Event(0, "compute", "b", 2.0, 5.0, 0, 0),
                Event(0, "comm", "x", 1.0, 3.0, 0, 0), Event(1, "compute", "c", 4.0, 9.0, 0, 0),
                Event(2, "compute", "d", 0.0, 1.0, 0, 0)])
    assert tr.busy_within([(1.0, 4.0), (0.0, 6.0), (1.0, 2.0)]) == [3.0, 2.0, 0.0]
    assert tr.busy_within([(0.0, 9.0)] * 3, stream="comm") == [2.0, 0.0, 0.0]


def test_plot_colours_by_op_name_with_a_legend():
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np
    import pytest

    import minidist as md

    def body():
        x = np.ones(64, np.float32)
        md.dist.all_reduce(x, algorithm="ring")
        md.dist.broadcast(x, 0)

    tr = md.launch(body, world_size=2).trace
    ax = tr.plot(streams=("comm",), color_by="name", unit="us")
    labels = sorted(t.get_text() for t in ax.get_legend().get_texts())
    assert labels == ["all_reduce", "broadcast"]
    assert ax.get_xlabel() == "simulated time (us)"
    with pytest.raises(ValueError, match="color_by"):
        tr.plot(color_by="rank")


def _recorded(seed: int = 0, ranks: int = 3, per_rank: int = 400) -> dict[int, list[tuple]]:
    """Recorder tuples (stream, name, start, end, nbytes, flops) with many equal starts, as a real run has."""
    rng = np.random.default_rng(seed)
    out = {}
    for r in range(ranks):
        starts = np.round(np.sort(rng.uniform(0, 1, per_rank)), 2)  # rounded: ties across streams and ranks
        out[r] = [(str(rng.choice(["compute", "comm", "link"])), f"op{i % 5}", float(s), float(s + rng.uniform(0, 0.1)),
                   float(rng.integers(1, 1000)), 0.0) for i, s in enumerate(rng.permutation(starts))]
    return out


def test_a_launch_trace_sorts_its_events_as_a_trace_of_events_does():
    per_rank = _recorded()
    lazy = Trace.from_recorders(per_rank)
    assert len(lazy) == sum(len(v) for v in per_rank.values())  # counted without building the events
    eager = Trace(Event(r, *e) for r, evs in per_rank.items() for e in evs)
    assert lazy.events == eager.events  # same order, ties included (stable on start, rank, stream)
    assert [e.start for e in lazy] == sorted(e.start for e in lazy)


def test_sums_over_the_recorded_tuples_equal_sums_over_the_events():
    per_rank = _recorded(seed=1)
    events = Trace(Event(r, *e) for r, evs in per_rank.items() for e in evs).events
    windows = [(0.1, 0.45), (0.3, 0.9), (0.0, 1.0)]
    busy = [0.0] * 3
    for e in events:  # the definition, over the sorted events
        lo, hi = windows[e.rank]
        if e.stream == "compute" and e.end > lo and e.start < hi:
            busy[e.rank] += min(e.end, hi) - max(e.start, lo)
    steps = [(0.0, 0.25), (0.25, 0.5), (0.5, 2.0)]
    sent = {r: [sum(e.nbytes for e in events if e.rank == r and e.stream == "link" and lo <= e.start < hi)
                for lo, hi in steps] for r in range(3)}
    for tr in (Trace.from_recorders(per_rank), Trace(events)):  # before and after the events are built
        assert tr.busy_within(windows) == busy  # to the bit: the same additions in the same order
        assert {r: tr.bytes_within(r, steps) for r in range(3)} == sent
    assert Trace.from_recorders(per_rank).bytes_within(7, steps) == [0, 0, 0]  # a rank that sent nothing
