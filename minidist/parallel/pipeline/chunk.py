"""One virtual stage of a pipeline: the blocks it holds, and their forward (chapter 16, lab 10).

A chunk runs its blocks as the plain model would, with the seams every other strategy uses: each unit
(embeddings, block, head) goes through ``hooks.unit`` so that ZeRO-3/FSDP gather its weights around
it, blocks are run in checkpointed segments when recomputing, and the router losses of MoE blocks
leave the chunk as a second output, because each stage backpropagates its own share of the loss.
"""

from __future__ import annotations

import numpy as np

from minidist.autograd import functional as F
from minidist.nn.moe import MoE
from minidist.parallel.memory import ActivationLedger
from minidist.parallel.recompute import run_checkpointed, segments
from minidist.parallel.runner import Hooks


class Chunk:
    """One virtual stage: blocks ``[lo, hi)``, with the embeddings if first and the head if last.

    ``recompute_every`` k (None: keep every activation) runs the blocks in checkpointed segments of k,
    as ``md.parallel.train`` does without a pipeline: a stage then holds only its segment inputs per
    micro-batch in flight, and rebuilds one segment at a time in the backward. ``recompute_layers`` n
    (with k = 1) checkpoints only the chunk's first n blocks.
    """

    def __init__(self, model, lo: int, hi: int, first: bool, last: bool, recompute_every: int | None = None,
                 acts: ActivationLedger | None = None, hooks: Hooks | None = None,
                 recompute_layers: int | None = None) -> None:
        self.model, self.lo, self.hi, self.first, self.last = model, lo, hi, first, last
        self.segments, self.acts = segments(lo, hi, recompute_every, recompute_layers), acts
        self.hooks = hooks or Hooks()  # ZeRO-3/FSDP gather a unit's weights around its use

    def prefixes(self) -> list[str]:
        names = [f"blocks.{i}." for i in range(self.lo, self.hi)]
        names += ["wte.", "wpe."] if self.first else []
        names += ["ln_f.", "lm_head."] if self.last else []
        return names

    def forward(self, x, targets=None):
        """``(output, router)``: the activation sent on (the mean cross-entropy on the last chunk) and the
        sum of this chunk's router losses (None without MoE layers). Each stage backpropagates its own
        router losses: the model's loss is a sum, and each term's gradient starts where it is computed."""
        m, hooks, router = self.model, self.hooks, []
        if self.first:
            T = x.shape[1]
            x = hooks.unit("embed", lambda: m.drop(m.wte(x) + m.wpe(np.arange(T))))
        for lo, hi, checkpointed in self.segments:
            def run(h, lo=lo, hi=hi):
                return self._through(lo, hi, h)
            out = run_checkpointed(run, x, self.acts) if checkpointed else run(x)
            x, router = (out[0], router + list(out[1:])) if isinstance(out, tuple) else (out, router)
        router = sum(router[1:], router[0]) if router else None
        if self.last:
            B, T = targets.shape

            def head(h):
                logits = m.lm_head(m.ln_f(h))
                loss_fn = getattr(m, "criterion", F.cross_entropy)  # tensor parallel: the vocabulary-parallel loss
                return loss_fn(logits.reshape(B * T, -1), targets.reshape(B * T))
            return hooks.unit("head", head, x), router
        return x, router

    def _through(self, lo: int, hi: int, x):
        """Blocks ``lo..hi-1``: ``x``, or ``(x, *router losses)`` when they hold MoE layers (outputs, so that
        a checkpointed segment keeps their gradient)."""
        moes = [mod for i in range(lo, hi) for mod in self.model.blocks[i].modules() if isinstance(mod, MoE)]
        for i in range(lo, hi):
            x = self.hooks.unit(f"block.{i}", self.model.blocks[i], x)
        return (x, *(mod.aux_loss for mod in moes)) if moes else x
