"""Running the learner's code on simulated ranks, and saying which rank got what.

A check that exercises a distributed function (a learner-written shift, an all-reduce built from
other collectives) launches it on a few world sizes. Two things make the feedback useful: runtime
failures become :class:`CheckFailed` with the usual cause named (an unfinished stub, a deadlock, ranks
calling different collectives), and wrong results are listed rank by rank with the first bad index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from minidist.labs.check import CheckFailed
from minidist.labs.notebook import learner_lines
from minidist.runtime import RankError, launch

DEADLOCK_HINT = ("every rank is blocked waiting for another one (a deadlock). A blocking send returns only once "
                 "the peer has received, so if all ranks send first nobody is receiving: post the receive with "
                 "irecv (or send with isend) before the blocking call, or let even ranks send first and odd "
                 "ranks receive first")


def run_ranks(name: str, body: Callable, world_size: int, args: tuple = (), cluster=None, timeout: float = 3.0,
              hint: str = ""):
    """``launch(body, world_size, args)`` with failures turned into CheckFailed naming the cause.

    ``hint`` is added when a rank raised something other than the causes recognised here.
    """
    try:
        return launch(body, world_size=world_size, args=args, cluster=cluster, timeout=timeout, quiet=True)
    except RankError as e:
        kinds = {r: err[0] for r, err in e.errors.items()}
        first = e.errors.get(e.rank, ("", "", ""))
        on = f"{name} on {world_size} rank{'s' if world_size != 1 else ''}"
        if "NotImplementedError" in kinds.values():
            raise CheckFailed(f"{name}: the exercise is not done yet (it raised NotImplementedError)") from None
        if first[0] in ("CommTimeoutError", "DeadlockError"):
            raise CheckFailed(f"{on} never finished: {first[1]}\n  hint: {DEADLOCK_HINT}") from None
        if first[0] == "MismatchError":
            raise CheckFailed(f"{on}: the ranks made different calls: {first[1]}\n"
                              "  hint: every rank must call the same collectives in the same order, with buffers "
                              "of the same shape and dtype") from None
        if first[0] == "TypeError" and "NoneType" in str(first[1]):
            hint = ("if that None came from an md.dist collective: they work in place and return None (a Work with "
                    "async_op=True), so call md.dist.all_reduce(x) and go on using x, do not assign its result")
        msg = f"{on}: rank {e.rank} raised {first[0]}: {first[1]}" + (f"\n  hint: {hint}" if hint else "")
        frames = learner_lines(first[2] if len(first) > 2 else "")
        if frames:
            msg += f"\n\nwhere your code raised it, on rank {e.rank}:\n{frames}"
        raise CheckFailed(msg) from None



def _show(a: np.ndarray, limit: int = 12) -> str:
    a = np.asarray(a)
    flat = a.reshape(-1)
    text = np.array2string(flat[:limit], precision=6, separator=", ")
    return text[:-1] + ", ...]" if flat.size > limit else text


def compare_ranks(name: str, got: Sequence, want: Sequence, context: str = "",
                  diagnose: Callable[[int, np.ndarray, np.ndarray], str | None] | None = None,
                  hint: str = "", rtol: float = 0.0) -> None:
    """Fail listing every rank whose result differs from ``want[r]`` (first bad index, both values).

    ``diagnose(rank, got, want)`` may name the typical mistake behind one rank's wrong result.
    """
    lines, hints = [], []
    for r, (g, w) in enumerate(zip(got, want)):
        w = np.asarray(w)
        if g is None:
            lines.append(f"rank {r}: got None (did you forget to return the result?)")
            continue
        g = np.asarray(g)
        if g.shape != w.shape:
            lines.append(f"rank {r}: result has shape {g.shape}, expected {w.shape}")
            continue
        ok = np.isclose(g, w, rtol=rtol, atol=0.0, equal_nan=True) if rtol else (g == w) | (np.isnan(g) & np.isnan(w))
        if not np.all(ok):
            i = int(np.flatnonzero(~ok.reshape(-1))[0])
            lines.append(f"rank {r}: first wrong element at index {i}: expected {w.reshape(-1)[i].item()!r}, got "
                         f"{g.reshape(-1)[i].item()!r}\n    expected {_show(w)}\n    got      {_show(g)}")
            better = diagnose(r, g, w) if diagnose else None
            if better and better not in hints:
                hints.append(better)
    if lines:
        head = f"{name}{' ' + context if context else ''}: wrong on {len(lines)} of {len(want)} ranks:"
        msg = head + "\n  " + "\n  ".join(lines)
        h = "; ".join(hints) or hint
        if h:
            msg += f"\n  hint: {h}"
        raise CheckFailed(msg)
