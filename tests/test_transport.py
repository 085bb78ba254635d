"""Point-to-point messages: shapes, dtypes, tags, chunking, Tensors, mismatches (lab 00)."""

import time

import numpy as np
import pytest

import minidist.dist as dist
from minidist.hardware.cluster import Cluster
from minidist.runtime import RankError, launch, shm, transport
from minidist.runtime.context import current
from minidist.runtime.shm import default_layout

DTYPES = [np.float64, np.float32, np.float16, np.int64, np.int32, np.uint8, np.complex64, np.bool_]
SHAPES = [(), (0,), (1,), (7,), (3, 5), (2, 3, 4)]


def _value(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    return np.asarray(rng.integers(0, 100, size=shape) % (2 if dtype == np.bool_ else 100)).astype(dtype)


def _exchange_many():
    r = dist.get_rank()
    checked = 0
    for i, dtype in enumerate(DTYPES):
        for j, shape in enumerate(SHAPES):
            x = _value(shape, dtype, 100 * i + j)
            if r == 0:
                dist.send(x, 1, tag=i)
                back = np.empty_like(x)
                dist.recv(back, 1, tag=i)
                assert back.dtype == x.dtype and back.shape == x.shape
                np.testing.assert_array_equal(back, x)
                checked += 1
            else:
                y = np.zeros(shape, dtype)
                dist.recv(y, 0, tag=i)
                np.testing.assert_array_equal(y, x)
                dist.send(y, 0, tag=i)
    return checked


def test_p2p_every_dtype_and_shape():
    res = launch(_exchange_many, 2)
    assert res[0] == len(DTYPES) * len(SHAPES)


def _out_of_order():
    r = dist.get_rank()
    if r == 0:
        for tag in range(5):
            dist.isend(np.full(3, float(tag)), 1, tag=tag)
        return None
    got = {}
    order = [3, 0, 4, 2, 1]
    works = []
    for tag in order[:2]:  # blocking receives for tags whose messages arrive after others
        x = np.zeros(3)
        dist.recv(x, 0, tag=tag)
        got[tag] = x[0]
    for tag in order[2:]:
        x = np.zeros(3)
        works.append((tag, x, dist.irecv(x, 0, tag=tag)))
    for tag, x, w in works:
        w.wait()
        got[tag] = x[0]
    return got


def test_tags_can_be_received_out_of_order():
    res = launch(_out_of_order, 2)
    assert res[1] == {t: float(t) for t in range(5)}


def _same_tag_fifo():
    if dist.get_rank() == 0:
        for k in range(4):
            dist.send(np.array([k]), 1, tag=7)
        return None
    out = []
    for _ in range(4):
        x = np.zeros(1, np.int64)
        dist.recv(x, 0, tag=7)
        out.append(int(x[0]))
    return out


def test_same_tag_messages_keep_their_order():
    assert launch(_same_tag_fifo, 2)[1] == [0, 1, 2, 3]


def _big(n):
    r = dist.get_rank()
    x = np.arange(n, dtype=np.float64) * (r + 1)
    y = np.empty_like(x)
    # both send at once: needs real async progress, the message is larger than the channel
    ws = dist.isend(x, 1 - r)
    wr = dist.irecv(y, 1 - r)
    wr.wait()
    ws.wait()
    return bool(np.array_equal(y, np.arange(n, dtype=np.float64) * (2 - r)))


def test_large_messages_stream_through_the_bounded_channel():
    lay = default_layout(2)
    n = 3 * lay.nslots * lay.slot_bytes // 8 + 123  # three channels' worth plus a partial chunk
    assert launch(_big, 2, args=(n,)).values == [True, True]


class FakeTensor:
    def __init__(self, data):
        self.data = data


def _tensors():
    r = dist.get_rank()
    t = FakeTensor(np.zeros((2, 2), np.float32))
    if r == 0:
        t.data[:] = 5
        dist.send(t, 1)
        return None
    dist.recv(t, 0)
    return t.data.tolist()


def test_tensor_like_objects_are_sent_by_their_data():
    assert launch(_tensors, 2)[1] == [[5, 5], [5, 5]]


def test_minidist_tensor_is_accepted():
    import minidist as md

    def f():
        t = md.tensor(np.full(3, float(dist.get_rank())))
        if dist.get_rank() == 0:
            dist.send(t, 1)
        else:
            dist.recv(t, 0)
        return t.data.tolist()

    assert launch(f, 2)[1] == [0.0, 0.0, 0.0]


def _noncontiguous():
    r = dist.get_rank()
    base = np.zeros((4, 6))
    if r == 0:
        dist.send(np.arange(24.0).reshape(4, 6)[:, ::2], 1)
        return None
    view = base[:, 1::2]
    dist.recv(view, 0)
    return base


def test_noncontiguous_buffers():
    base = launch(_noncontiguous, 2)[1]
    np.testing.assert_array_equal(base[:, 1::2], np.arange(24.0).reshape(4, 6)[:, ::2])
    assert not base[:, ::2].any()


def _mismatch(kind):
    r = dist.get_rank()
    try:
        if r == 0:
            dist.send(np.zeros(3, np.float32), 1)
        elif kind == "size":
            dist.recv(np.zeros(4, np.float32), 0)
        else:
            dist.recv(np.zeros(3, np.float64), 0)
    except ValueError as e:
        msg = str(e)
    else:
        msg = None
    # the channel stays usable after a refused message
    x = np.array([float(r)])
    if r == 0:
        dist.send(x, 1)
    else:
        dist.recv(x, 0)
    return msg, float(x[0])


@pytest.mark.parametrize("kind", ["size", "dtype"])
def test_mismatch_raises_on_both_sides(kind):
    res = launch(_mismatch, 2, args=(kind,))
    for msg, x in res:
        assert msg is not None, "both sender and receiver must raise"
        assert "rank 0" in msg and "rank 1" in msg and "(3,)" in msg and "float32" in msg
        assert ("(4,)" in msg) if kind == "size" else ("float64" in msg)
        assert x == 0.0


def test_bad_arguments_name_the_op():
    def f():
        with pytest.raises(ValueError, match="send.*itself"):
            dist.send(np.zeros(1), dist.get_rank())
        with pytest.raises(ValueError, match="recv: src=5"):
            dist.recv(np.zeros(1), 5)
        with pytest.raises(ValueError, match="tag"):
            dist.send(np.zeros(1), 1 - dist.get_rank(), tag=-1)
        with pytest.raises(TypeError, match="send"):
            dist.send([1, 2], 1 - dist.get_rank())
        return True

    assert all(launch(f, 2))


def test_unmatched_receive_fails_fast_when_peer_finished():
    def f():
        if dist.get_rank() == 0:
            dist.recv(np.zeros(1), 1)

    with pytest.raises(RankError, match=r"rank 0 waits in recv\(src=1, tag=0\) but rank 1 has finished"):
        launch(f, 2, cluster=Cluster.uniform())


def test_ring_of_isends_three_ranks():
    def f():
        r, p = dist.get_rank(), dist.get_world_size()
        x = np.full(1000, r, np.int32)
        y = np.empty_like(x)
        w = [dist.isend(x, (r + 1) % p), dist.irecv(y, (r - 1) % p)]
        for work in w:
            work.wait()
        return int(y[0])

    assert launch(f, 3).values == [2, 0, 1]


def _long_signatures(tail_differs: bool):
    from minidist.runtime.context import current

    tp = current().transport
    r = dist.get_rank()
    # a collective over ~200 ranks has a signature this long (its rank list), longer than a header holds
    sig = f"all_reduce(algorithm='ring') on ranks {list(range(400))}".encode()
    if tail_differs and r == 1:
        sig = sig[:-2] + b"8]"
    x = np.arange(4.0) if r == 0 else np.zeros(4)
    if r == 0:
        tp.wait([tp.isend(x, 1, -7, 0.0, sig=sig, name="all_reduce")])
    else:
        tp.wait([tp.irecv(x, 0, -7, 0.0, sig=sig, name="all_reduce")])
    return x.tolist()


def test_signatures_longer_than_a_header_match_themselves_and_nothing_else():
    assert launch(_long_signatures, 2, args=(False,))[1] == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(RankError, match="ranks disagree about a collective call"):
        launch(_long_signatures, 2, args=(True,), timeout=5)


def _tags_disagree():
    if dist.get_rank() == 0:
        dist.send(np.ones(1), 1, tag=1)
    else:
        dist.recv(np.ones(1), 0, tag=2)


def test_a_tag_mismatch_names_the_tag_that_was_sent():
    with pytest.raises(RankError, match=r"rank 0 has finished and will never send it \(rank 0 sent rank 1 a "
                                        r"message with tag 1, which no receive asked for"):
        launch(_tags_disagree, 2, timeout=5)


def _held_header_from_a_rank_that_left():
    tp = current().transport
    x = np.zeros(4)
    if dist.get_rank() == 1:
        dist.barrier()
        tp.isend(np.arange(4.0), 0, tag=7, ready=0.0, eager=True)  # done once in the channel: rank 1 leaves
        return None
    op = tp.irecv(x, 1, tag=7, ready=0.0, held=True)
    dist.barrier()  # no progress pass from here on until the sender has finished
    while tp.board.state(1) != shm.FINISHED:
        time.sleep(0.01)
    timing = transport._Timing(op)
    tp._check_peers([timing])  # the header is in the channel: a peer that left after sending is no fault
    assert timing.done and not op.done  # the header taken, the bytes still held
    tp.wait([op])
    return x


def test_a_held_receive_finds_the_header_of_a_sender_that_has_left():
    x, _ = launch(_held_header_from_a_rank_that_left, 2, timeout=30)
    np.testing.assert_array_equal(x, np.arange(4.0))


def _refused_by_a_rank_that_then_failed():
    tp = current().transport
    if dist.get_rank() == 1:
        dist.recv(np.zeros(5), 0, tag=3)  # does not fit: refused, and rank 1 fails with a MismatchError
        return
    op = tp.isend(np.zeros(4), 1, tag=3, ready=0.0)
    while tp.board.state(1) != shm.FAILED:  # no progress pass until the receiver has refused and failed
        time.sleep(0.01)
    tp._check_peers([op])  # the refusal is the cause, not the receiver's exit


def test_a_send_refused_by_a_rank_that_failed_reports_the_refusal():
    with pytest.raises(RankError) as info:
        launch(_refused_by_a_rank_that_then_failed, 2, timeout=30)
    errors = info.value.errors
    assert errors[0][0] == "MismatchError" and "does not fit" in errors[0][1], errors[0]
