"""Hogwild: on sparse examples lock-free workers rarely collide and reach sequential SGD's loss in a quarter of the
simulated time; on dense examples most updates collide."""

from __future__ import annotations

import pytest

from minidist.parallel import SparseLogistic, train_hogwild


def test_sparse_updates_rarely_collide_and_lose_nothing():
    problem = SparseLogistic(n=2000, dim=1000, nnz=5)
    alone = train_hogwild(problem, 1, 1000)
    four = train_hogwild(problem, 4, 1000)
    assert alone.collisions == 0 and four.collisions < 0.15
    assert abs(four.losses[-1] - alone.losses[-1]) < 0.02 * alone.losses[-1]
    assert alone.losses[-1] < 0.8 * alone.losses[0]  # it trained
    assert four.time < alone.time / 3  # four workers, nobody waits for a lock


def test_dense_updates_mostly_collide():
    four = train_hogwild(SparseLogistic(n=2000, dim=20, nnz=20), 4, 600)
    assert four.collisions > 0.6


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="nnz"):
        SparseLogistic(dim=10, nnz=11)
    with pytest.raises(ValueError, match="workers and updates"):
        train_hogwild(SparseLogistic(), 0, 10)
