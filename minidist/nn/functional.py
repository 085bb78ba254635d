"""``md.nn.functional``: the differentiable functions of the autograd, under PyTorch's name for them."""

from minidist.autograd.functional import *  # noqa: F401,F403
