"""Bad arguments are refused at the call, naming the argument, before any rank starts."""

from __future__ import annotations

import math

import numpy as np
import pytest

import minidist as md
from minidist.parallel import ParallelConfig

CFG = md.GPTConfig(vocab_size=48, seq_len=8, d_model=16, n_layers=2, n_heads=2)


def _rank():
    return md.dist.get_rank()


@pytest.mark.parametrize("kwargs, match", [
    ({"timeout": math.nan}, "timeout must be a positive number"),
    ({"timeout": "5"}, "timeout must be a positive number"),
    ({"timeout": 0}, "timeout must be a positive number"),
    ({"timeout": math.inf}, "timeout must be a positive number"),
    ({"start_method": "thread"}, "start_method"),
    ({"deadline": math.nan}, "deadline must be None or a positive number"),
    ({"deadline": -1}, "deadline must be None or a positive number"),
    ({"deadline": "10"}, "deadline must be None or a positive number"),
])
def test_launch_refuses_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        md.launch(_rank, 2, **kwargs)


def test_launch_world_size_and_fn():
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        md.launch(_rank, True)
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        md.launch(_rank, 2.0)
    assert list(md.launch(_rank, np.int64(2))) == [0, 1]
    with pytest.raises(TypeError, match="fn must be a function"):
        md.launch("not a function", 2)


@pytest.mark.parametrize("kwargs, match", [
    ({"args": 5}, r"args must be a tuple of fn's positional arguments \(args=\(x,\) for one\), got int 5"),
    ({"kwargs": [1]}, "kwargs must be a dict of fn's keyword arguments, got list"),
    ({"cluster": "dgx-h100"}, r"cluster must be a md.Cluster \(md.Cluster.dgx_h100\(nodes=2\), say\), got str"),
])
def test_launch_refuses_arguments_of_the_wrong_kind_before_any_rank_starts(kwargs, match):
    with pytest.raises(TypeError, match=match):
        md.launch(_rank, 2, **kwargs)


def test_launch_takes_args_as_a_list_and_kwargs_as_any_mapping():
    from types import MappingProxyType

    def add(a, b, c=0):
        return a + b + c

    assert list(md.launch(add, 2, args=[1, 2], kwargs=MappingProxyType({"c": 3}))) == [6, 6]


@pytest.mark.parametrize("kwargs, match", [
    ({"steps": 1.5}, "steps must be an int"),
    ({"steps": 0}, "steps must be an int"),
    ({"global_batch": True}, "global_batch must be an int"),
    ({"optimizer": "adam"}, "optimizer must be 'adamw' or 'sgd'"),
    ({"lr": math.nan}, "lr must be a finite number"),
    ({"weight_decay": -0.1}, "weight_decay must be a finite number"),
    ({"betas": (0.9, 1.0)}, "betas must be two numbers"),
])
def test_train_refuses_bad_arguments_up_front(kwargs, match):
    with pytest.raises(ValueError, match=match):
        md.parallel.train(CFG, ParallelConfig(), **kwargs)
