"""md.estimate.comm: every collective equals its closed form (the runtime is tested against these)."""

import math

import pytest

import minidist as md
from minidist.estimate import comm

ct = md.estimate.collective_time
A, B = 3e-6, 40e9  # alpha (s), beta (bytes/s)


def lg(p):
    return math.ceil(math.log2(p))


def fl(p):  # a binomial reduce's critical path: floor(log2 p) rounds (early arrivals on separate links)
    return math.floor(math.log2(p))


CLOSED = {
    ("all_reduce", "ring"): lambda n, p: 2 * (p - 1) * A + 2 * (p - 1) / p * n / B,
    ("all_reduce", "tree"): lambda n, p: (fl(p) + lg(p)) * (A + n / B),
    # two half-rings: 2(p-1) steps of n/(2p) each way (the book's (p-1) alpha is not reachable); p=2 is the ring
    ("all_reduce", "bidirectional_ring"): lambda n, p: (2 * A + n / B if p == 2
                                                       else 2 * (p - 1) * A + (p - 1) / p * n / B),
    ("reduce_scatter", "ring"): lambda n, p: (p - 1) * (A + n / (p * B)),
    ("all_gather", "ring"): lambda n, p: (p - 1) * (A + n / (p * B)),
    ("all_to_all", "pairwise"): lambda n, p: (p - 1) * (A + n / (p * B)),
    ("broadcast", "tree"): lambda n, p: lg(p) * (A + n / B),
    ("reduce", "tree"): lambda n, p: fl(p) * (A + n / B),
    ("scatter", "tree"): lambda n, p: lg(p) * A + (p - 1) / p * n / B,
    ("gather", "tree"): lambda n, p: lg(p) * A + (p - 1) / p * n / B,
    ("send_recv", "ring"): lambda n, p: A + n / B,
}


@pytest.mark.parametrize("op,alg", sorted(CLOSED))
@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 12, 64])
@pytest.mark.parametrize("n", [0, 1024, 64e6])
def test_collective_time_equals_closed_form(op, alg, p, n):
    assert ct(op, n, p, A, B, alg) == pytest.approx(CLOSED[op, alg](n, p), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("p", [2, 4, 8, 16, 1024])
def test_halving_doubling_power_of_two(p):
    n = 1e8
    k = int(math.log2(p))
    assert ct("all_reduce", n, p, A, B, "halving_doubling") == pytest.approx(2 * k * A + 2 * (p - 1) / p * n / B)
    assert ct("reduce_scatter", n, p, A, B, "halving_doubling") == pytest.approx(k * A + (p - 1) / p * n / B)


@pytest.mark.parametrize("p", [3, 5, 6, 12])
def test_halving_doubling_remainder_step(p):
    n, q = 1e8, 1 << (p.bit_length() - 1)
    k = q.bit_length() - 1
    expected = 2 * (A + n / B) + 2 * k * A + 2 * (q - 1) / q * n / B
    assert ct("all_reduce", n, p, A, B, "halving_doubling") == pytest.approx(expected)
    # the fold makes a non-power of two slower than the power of two below it
    assert ct("all_reduce", n, p, A, B, "halving_doubling") > ct("all_reduce", n, q, A, B, "halving_doubling")


def test_rooted_ops_default_to_their_tree_and_all_to_all_to_pairwise():
    assert ct("broadcast", 1e6, 8, A, B) == ct("broadcast", 1e6, 8, A, B, "tree")
    assert ct("all_to_all", 1e6, 8, A, B) == ct("all_to_all", 1e6, 8, A, B, "pairwise")


@pytest.mark.parametrize("op", comm.OPS)
def test_one_rank_costs_nothing_except_send_recv(op):
    expected = A + 1e6 / B if op == "send_recv" else 0.0
    assert ct(op, 1e6, 1, A, B, comm.SUPPORTED[op][0]) == expected


def test_ring_beats_tree_above_crossover_and_loses_below():
    p = 256
    n_star = md.estimate.ring_tree_crossover_bytes(p, A, B)
    assert ct("all_reduce", n_star, p, A, B, "ring") == pytest.approx(ct("all_reduce", n_star, p, A, B, "tree"))
    assert ct("all_reduce", 2 * n_star, p, A, B, "ring") < ct("all_reduce", 2 * n_star, p, A, B, "tree")
    assert ct("all_reduce", n_star / 2, p, A, B, "ring") > ct("all_reduce", n_star / 2, p, A, B, "tree")


def test_bus_bandwidth_of_ideal_ring_tends_to_beta():
    n, p = 1e12, 16
    t = ct("all_reduce", n, p, A, B)
    assert md.estimate.bus_bandwidth("all_reduce", n, p, t) == pytest.approx(B, rel=1e-5)
    t = ct("all_gather", n, p, A, B)
    assert md.estimate.bus_bandwidth("all_gather", n, p, t) == pytest.approx(B, rel=1e-5)
    assert md.estimate.bus_bandwidth("broadcast", 100.0, 4, 2.0) == 50.0


def test_hierarchical_reduces_to_flat_ring_on_one_level():
    n = 5e8
    h = md.estimate.hierarchical_all_reduce_time
    assert h(n, 8, 1, A, B, 1.0, 1.0) == pytest.approx(ct("all_reduce", n, 8, A, B))
    assert h(n, 1, 16, 1.0, 1.0, A, B) == pytest.approx(ct("all_reduce", n, 16, A, B))


def test_crossover_and_overlap():
    assert md.estimate.crossover_bytes(1e-6, 900e9) == pytest.approx(900e3)
    assert md.estimate.overlapped_time(100, 50, 1.0) == 100
    assert md.estimate.overlapped_time(100, 50, 0.0) == 150


@pytest.mark.parametrize(
    "call,arg",
    [
        (lambda: ct("all_reduce", -1, 4, A, B), "nbytes"),
        (lambda: ct("all_reduce", 1, 0, A, B), "p"),
        (lambda: ct("all_reduce", 1, 2.5, A, B), "p"),
        (lambda: ct("all_reduce", 1, 4, -A, B), "alpha"),
        (lambda: ct("all_reduce", 1, 4, A, 0), "beta"),
        (lambda: ct("allreduce", 1, 4, A, B), "op"),
        (lambda: ct("all_reduce", 1, 4, A, B, "magic"), "algorithm"),
        (lambda: ct("all_gather", 1, 4, A, B, "tree"), "algorithm"),
        (lambda: md.estimate.hierarchical_all_reduce_time(1, 0, 2, A, B, A, B), "gpus_per_node"),
        (lambda: md.estimate.bus_bandwidth("all_reduce", 1, 4, 0), "seconds"),
    ],
)
def test_bad_input_names_the_argument(call, arg):
    with pytest.raises(ValueError, match=arg):
        call()
