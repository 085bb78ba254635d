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
    (lambda: {"optimizer": md.parallel.AdamW(lr=math.nan)}, "lr must be a finite number"),
    (lambda: {"optimizer": md.parallel.SGD(weight_decay=-0.1)}, "weight_decay must be a finite number"),
    (lambda: {"optimizer": md.parallel.AdamW(betas=(0.9, 1.0))}, "betas must be two numbers"),
])
def test_train_refuses_bad_arguments_up_front(kwargs, match):
    with pytest.raises(ValueError, match=match):  # the options objects check themselves as they are made
        md.parallel.train(CFG, ParallelConfig(), **(kwargs() if callable(kwargs) else kwargs))


@pytest.mark.parametrize("kwargs, match", [
    ({"zero_stage": 1.0}, r"zero_stage must be the int 0, 1, 2 or 3, got 1\.0"),
    ({"zero_stage": True}, "zero_stage must be the int 0, 1, 2 or 3, got True"),
    ({"fsdp": "yes"}, "fsdp must be True or False, got 'yes'"),
    ({"fsdp": 1}, "fsdp must be True or False, got 1"),
    ({"bucket_bytes": math.inf}, r"bucket_bytes must be a finite number of bytes > 0 .*, got inf"),
    ({"bucket_bytes": math.nan}, "bucket_bytes must be a finite number of bytes > 0 .*, got nan"),
    ({"bucket_bytes": "25MB"}, "bucket_bytes must be a finite number of bytes > 0 .*, got '25MB'"),
    ({"bucket_bytes": True}, "bucket_bytes must be a finite number of bytes > 0 .*, got True"),
    ({"bucket_bytes": 0}, "bucket_bytes must be a finite number of bytes > 0 .*, got 0"),
    ({"virtual_stages": True, "schedule": "interleaved"}, "virtual_stages must be an int >= 1, got True"),
    ({"virtual_stages": 2.0, "schedule": "interleaved"}, r"virtual_stages must be an int >= 1, got 2\.0"),
    ({"prefetch": True}, "prefetch must be an int >= 0, got True"),
    ({"dp": True}, "dp must be an int >= 1, got True"),
    ({"recompute": 2.0}, r"recompute must be None, 'full', 'selective' or an int k >= 1 .*got 2\.0"),
])
def test_parallel_config_refuses_values_of_the_wrong_type(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ParallelConfig(**kwargs)


def test_parallel_config_takes_what_it_documents():
    pc = ParallelConfig(zero_stage=3, fsdp=False, bucket_bytes=1.5e6, virtual_stages=2, schedule="interleaved",
                        pp=2, prefetch=0)
    assert (pc.zero_stage, pc.bucket_bytes, pc.virtual_stages) == (3, 1.5e6, 2)
    assert ParallelConfig(bucket_bytes=np.float64(4096)).bucket_bytes == 4096


@pytest.mark.parametrize("data", ["abc", b"abc", None, [1, "a"], {"a": 1}])
def test_tensor_refuses_data_that_is_not_numbers(data):
    with pytest.raises(TypeError, match=r"md.tensor: data must be numbers or booleans .*, got "
                                        + type(data).__name__):
        md.tensor(data)


def test_tensor_takes_numbers_and_booleans():
    assert md.tensor([True, False]).dtype == np.bool_
    assert md.tensor(3).dtype.kind == "i" and md.tensor(1 + 2j).dtype.kind == "c"
    assert md.tensor(np.arange(3, dtype=np.uint8), dtype=np.float32).dtype == np.float32
