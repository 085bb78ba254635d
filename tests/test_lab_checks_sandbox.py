"""Lab 00 checks accept the right answers and reject the typical wrong ones with the intended hint."""

import numpy as np
import pytest

import minidist as md
from minidist.labs import CheckFailed


def test_send_time_accepts_and_names_mistakes(capsys):
    md.labs.check_send_time(lambda n, a, b: a + n / b)
    assert capsys.readouterr().out.startswith("ok: send_time")
    with pytest.raises(CheckFailed, match="left out the latency"):
        md.labs.check_send_time(lambda n, a, b: n / b)
    with pytest.raises(CheckFailed, match="divide the bytes"):
        md.labs.check_send_time(lambda n, a, b: a + n * b)
    with pytest.raises(CheckFailed, match="no factor of 8"):
        md.labs.check_send_time(lambda n, a, b: a + 8 * n / b)
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_send_time(lambda n, a, b: (_ for _ in ()).throw(NotImplementedError))


def shift_good(x):
    r, p = md.dist.get_rank(), md.dist.get_world_size()
    y = np.empty_like(x)
    w = md.dist.isend(x, (r + 1) % p)
    md.dist.recv(y, (r - 1) % p)
    w.wait()
    return y


def shift_even_odd(x):
    r, p = md.dist.get_rank(), md.dist.get_world_size()
    y = np.empty_like(x)
    if r % 2 == 0:
        md.dist.send(x, (r + 1) % p)
        md.dist.recv(y, (r - 1) % p)
    else:
        md.dist.recv(y, (r - 1) % p)
        md.dist.send(x, (r + 1) % p)
    return y


def shift_wrong_way(x):
    r, p = md.dist.get_rank(), md.dist.get_world_size()
    y = np.empty_like(x)
    w = md.dist.isend(x, (r - 1) % p)
    md.dist.recv(y, (r + 1) % p)
    w.wait()
    return y


def shift_returns_own(x):
    shift_good(x)
    return x


def shift_deadlock(x):
    r, p = md.dist.get_rank(), md.dist.get_world_size()
    y = np.empty_like(x)
    md.dist.send(x, (r + 1) % p)
    md.dist.recv(y, (r - 1) % p)
    return y


def shift_overwrites(x):
    y = shift_good(x)
    x[...] = y
    return x


def test_shift_right_accepts_two_correct_solutions(capsys):
    md.labs.check_shift_right(shift_good)
    md.labs.check_shift_right(shift_even_odd)
    assert capsys.readouterr().out.count("ok: shift_right") == 2


def test_shift_right_names_the_rank_and_the_mistake():
    with pytest.raises(CheckFailed, match="the data came from the right") as e:
        md.labs.check_shift_right(shift_wrong_way)
    msg = str(e.value)  # p = 2 cannot tell left from right; p = 3 can, and every rank is listed
    assert "on 3 ranks" in msg and "wrong on 3 of 3 ranks" in msg
    assert "rank 0: first wrong element at index 0: expected 200.0, got 100.0" in msg
    assert "rank 2: first wrong element at index 0: expected 100.0, got 0.0" in msg
    with pytest.raises(CheckFailed, match="returned its own x"):
        md.labs.check_shift_right(shift_returns_own)
    with pytest.raises(CheckFailed, match="overwrote their input"):
        md.labs.check_shift_right(shift_overwrites)
    with pytest.raises(CheckFailed, match="not done yet"):
        md.labs.check_shift_right(lambda x: (_ for _ in ()).throw(NotImplementedError))


def test_shift_right_explains_a_deadlock():
    with pytest.raises(CheckFailed, match="never finished.*\n.*deadlock"):
        md.labs.check_shift_right(shift_deadlock, world_sizes=(2,), timeout=0.5)


def _direct(x, rebind=False, library=False):
    r, p = md.dist.get_rank(), md.dist.get_world_size()
    if library:
        md.dist.all_reduce(x)
        return
    if r == 0:
        incoming = np.empty_like(x)
        for src in range(1, p):
            md.dist.recv(incoming, src)
            if rebind:
                x = x + incoming
            else:
                x += incoming
        for dst in range(1, p):
            md.dist.send(x, dst)
    else:
        md.dist.send(x, 0)
        md.dist.recv(x, 0)


def test_direct_all_reduce_check_accepts_send_recv_and_rejects_the_library_and_a_rebound_buffer():
    from functools import partial

    md.labs.check_direct_all_reduce(_direct)
    with pytest.raises(CheckFailed, match="write it from md.dist.send"):
        md.labs.check_direct_all_reduce(partial(_direct, library=True))
    with pytest.raises(CheckFailed, match="in place"):
        md.labs.check_direct_all_reduce(partial(_direct, rebind=True))
