"""Optimizers that update numpy arrays in place: SGD, AdamW, global-norm clipping, LR schedules."""

from minidist.optim.adamw import AdamW, adamw_update_
from minidist.optim.clip import clip_grad_norm_, global_grad_norm
from minidist.optim.optimizer import Optimizer
from minidist.optim.schedule import LRScheduler, warmup_cosine
from minidist.optim.sgd import SGD, sgd_update_

__all__ = ["SGD", "AdamW", "LRScheduler", "Optimizer", "adamw_update_", "clip_grad_norm_", "global_grad_norm",
           "sgd_update_", "warmup_cosine"]
