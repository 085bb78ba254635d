"""Lab 07 flows_per_nic check: the busiest node, counting the edge that closes the ring."""

import pytest

import minidist as md
from minidist.labs import CheckFailed
from minidist.labs.topology_checks import edges_leaving as _leaving


def flows_good(order, G):
    return max(_leaving(order, G).values(), default=0)


def flows_without_closing_edge(order, G):
    return max(_leaving(order, G, closed=False).values(), default=0)


def flows_average(order, G):
    return sum(_leaving(order, G).values()) // len({a // G for a in order})


def test_flows_per_nic_rejects_the_open_ring_and_the_average(capsys):
    with pytest.raises(CheckFailed, match=r"\[0, 1, 2, 4, 5, 3\], 2(.|\n)*count the edge that closes the ring"):
        md.labs.check_flows_per_nic(flows_without_closing_edge)
    with pytest.raises(CheckFailed, match=r"\[0, 1, 4, 3, 5, 2\], 2(.|\n)*average over the nodes"):
        md.labs.check_flows_per_nic(flows_average)
    md.labs.check_flows_per_nic(flows_good)
    assert "ok: flows_per_nic" in capsys.readouterr().out
