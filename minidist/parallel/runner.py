"""One micro-batch of a GPT through forward and backward, with the places strategies hook into.

The arithmetic is exactly ``GPT.forward`` (embeddings, blocks, final norm, head, mean
cross-entropy), unrolled so that a strategy sees each unit go by: ``pre_forward(key)`` and
``post_forward(key, out)`` around the embeddings (``"embed"``), each block (``"block.i"``) and the
head (``"head"``). ZeRO-3 and FSDP gather weights there, recomputation groups blocks into
checkpointed segments, and every unit's activations are measured from the graph and held on the
ledger until the backward has gone past that unit.
"""

from __future__ import annotations

import numpy as np

from minidist.autograd import functional as F
from minidist.nn.moe import MoE
from minidist.parallel.config import ParallelConfig
from minidist.parallel.memory import ActivationLedger, graph_bytes
from minidist.parallel.recompute import run_checkpointed, segments


class Hooks:
    """What a strategy may do around units; the default does nothing (plain data parallelism)."""

    phase = "forward"

    def pre_forward(self, key: str) -> None:
        pass

    def post_forward(self, key: str, out) -> None:
        pass

    def post_backward(self, key: str) -> None:
        """The unit's input gradient is computed: its backward no longer reads the weights."""

    def unit(self, key: str, fn, *args):
        """``fn(*args)`` as unit ``key``: the strategy sees it start and end, forward and backward."""
        self.pre_forward(key)
        out = fn(*args)
        self.post_forward(key, out)
        listens = type(self).post_backward is not Hooks.post_backward
        if listens and args and getattr(args[0], "requires_grad", False) and self.phase == "forward":
            args[0].register_hook(lambda _g: self.post_backward(key))
        return out


class Runner:
    def __init__(self, model, config: ParallelConfig, acts: ActivationLedger, hooks: Hooks | None = None) -> None:
        if model.config.dropout:
            raise ValueError(f"parallel.train: dropout must be 0 (random masks would differ between layouts), "
                             f"got {model.config.dropout}")
        self.model, self.acts = model, acts
        self.hooks = hooks or Hooks()
        self.segments = segments(0, len(model.blocks), config.recompute_every, config.recompute_layers)

    def _blocks(self, lo: int, hi: int):
        """Blocks ``lo..hi-1`` as one function: ``x -> x``, or ``(x, *router losses)`` if they hold MoE layers.

        The router losses leave the segment as outputs, so that under recomputation they stay in the
        graph (a loss read from a module attribute after a checkpointed forward has no gradient).
        """
        moes = [m for b in self.model.blocks[lo:hi] for m in b.modules() if isinstance(m, MoE)]

        def run(x):
            for i in range(lo, hi):
                x = self.hooks.unit(f"block.{i}", self.model.blocks[i], x)
            return (x, *(m.aux_loss for m in moes)) if moes else x
        return run

    def loss(self, idx: np.ndarray, targets: np.ndarray):
        """Forward one micro-batch; returns the mean cross-entropy (a scalar tensor)."""
        m, acts = self.model, self.acts
        self.hooks.phase = "forward"
        B, T = idx.shape
        x = self.hooks.unit("embed", lambda: m.drop(m.wte(idx) + m.wpe(np.arange(T))))
        acts.hold(graph_bytes(x), "embed")  # embeddings' activations: held until the step ends
        router_losses = []
        for lo, hi, checkpointed in self.segments:
            run = self._blocks(lo, hi)
            inp = x
            out = run_checkpointed(run, inp, acts) if checkpointed else run(inp)
            x = out[0] if isinstance(out, tuple) else out
            router_losses += list(out[1:]) if isinstance(out, tuple) else []
            token = acts.hold(graph_bytes(x, exclude=[inp]), "segment")
            inp.register_hook(lambda _g, token=token: acts.release(token))  # the segment's backward is done

        def head(h):
            logits = m.lm_head(m.ln_f(h))
            loss_fn = getattr(m, "criterion", F.cross_entropy)  # tensor parallel: vocabulary-parallel loss
            return loss_fn(logits.reshape(B * T, -1), targets.reshape(B * T))

        loss = self.hooks.unit("head", head, x)
        acts.hold(graph_bytes(loss, exclude=[x]), "head")
        if router_losses:  # GPT.forward's order: cross-entropy + (sum of the layers' router losses)
            loss = loss + sum(router_losses[1:], router_losses[0])
        return loss

    def backward(self, loss, scale: float) -> None:
        """Backpropagate ``scale * loss`` (the micro-batch's share of the global mean)."""
        self.hooks.phase = "backward"
        (loss * scale).backward()
        self.acts.release_all()
