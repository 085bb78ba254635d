"""What every lab check shares: a failure that explains itself, and number comparison with a hint.

A check runs the learner's code against a reference and, when they disagree, raises
:class:`CheckFailed` whose message says which input went wrong, what was expected, what came
back, and a hint pointing at the usual mistake. On success it prints one short line, so a
notebook shows progress without noise. In a notebook the failure shows its message and the learner's
own frames, never the check's source (the answer); ``notebook.py`` renders every other error.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

_PACKAGE = str(Path(__file__).resolve().parents[1])
_RED, _RESET = "\x1b[0;31m", "\x1b[0m"


class CheckFailed(AssertionError):
    """The learner's answer is wrong; the message says where and hints at why."""

    def _render_traceback_(self) -> list[str]:
        """What IPython shows: the message and the learner's frames, never the check's source."""
        return render_check_failure(self)


def learner_frames(exc: BaseException | None) -> list[str]:
    """The formatted traceback frames of ``exc`` that are not minidist's own (the learner's code)."""
    if exc is None or exc.__traceback__ is None:
        return []
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_PACKAGE)]
    return traceback.format_list(frames)


def learner_lines(traceback_text: str) -> str:
    """The frames of a formatted traceback (a rank's, which arrives as text) that are not minidist's own."""
    lines, keep = [], False
    for line in traceback_text.splitlines():
        if line.startswith("  File "):
            keep = not line.startswith(f'  File "{_PACKAGE}')
        elif not line.startswith("    "):
            keep = False  # the header, or the exception line at the end
        if keep:
            lines.append(line)
    return "\n".join(lines)


def render_check_failure(exc: BaseException) -> list[str]:
    """The lines a notebook shows for a failing check: its message and the learner's own frames."""
    name = type(exc).__name__
    lines = f"{_RED}{name}{_RESET}: {exc}".splitlines()
    frames = learner_frames(exc.__cause__)
    if frames:
        lines += ["", f"where your code raised {type(exc.__cause__).__name__}:"]
        lines += [line.rstrip("\n") for frame in frames for line in frame.splitlines()]
    return lines


def _plain(v):
    """``v`` with numpy scalars made Python numbers, so a message reads ``0.5``, not ``np.float64(0.5)``."""
    if isinstance(v, np.generic):
        return v.item()
    if type(v) in (tuple, list):  # not a namedtuple, whose constructor takes fields, not an iterable
        return type(v)(_plain(x) for x in v)
    if isinstance(v, dict):
        return {_plain(k): _plain(x) for k, x in v.items()}
    return v


def fail(what: str, expected, got, hint: str = "") -> None:
    msg = f"{what}\n  expected: {_plain(expected)!r}\n  got:      {_plain(got)!r}"
    if hint:
        msg += f"\n  hint: {hint}"
    raise CheckFailed(msg)


def busy_spans(spans) -> list[tuple[float, float]]:
    """``(start, end)`` spans merged where they touch or overlap: the instants a stream is busy, each once."""
    out: list[list[float]] = []
    for lo, hi in sorted((float(a), float(b)) for a, b in spans if b > a):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(a, b) for a, b in out]


def busy_and_both(a, b) -> tuple[float, float, float]:
    """(time ``a`` is busy, time ``b`` is busy, time both are) for two streams' spans in any order: the reference
    of the checks that grade an overlap (labs 15 and 23)."""
    a, b = busy_spans(a), busy_spans(b)
    i = j = 0
    both = 0.0
    while i < len(a) and j < len(b):
        both += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return sum(y - x for x, y in a), sum(y - x for x, y in b), both


def learner_name(fn: Callable, default: str) -> str:
    """The name the learner gave their function (``walk``, ``one_f_one_b``), so a message quotes their call; a
    lambda or a partial has none and gets ``default``."""
    name = getattr(fn, "__name__", default)
    return name if name.isidentifier() else default


def attempt(name: str, fn: Callable, *args, shown: str | None = None, hint: str = ""):
    """``fn(*args)``, the learner's code: a stub says the exercise is not done yet, and any other error becomes a
    CheckFailed naming the call (``shown``, else ``name`` and the arguments), with the learner's frames below it."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise CheckFailed(f"{name}: the exercise is not done yet (it raised NotImplementedError)") from None
    except Exception as e:
        call = shown if shown is not None else f"{name}{_plain(args)}"
        if isinstance(e, TypeError) and "NoneType" in str(e):
            hint = ("a value is None here: an optional argument left at its default (None), or a function that "
                    "returned nothing; handle that case first")
        raise CheckFailed(f"{call} raised {type(e).__name__}: {e}" + (f"\n  hint: {hint}" if hint else "")) from e


def number(what: str, got, hint: str = "") -> float:
    """``got`` as a float, or a CheckFailed saying that ``what`` should be one number."""
    if got is None:
        fail(what, "a number", None, "did you forget to `return` the value?")
    if not isinstance(got, (bool, str)) and np.ndim(got) == 0:
        try:
            return float(got)
        except (TypeError, ValueError):
            pass
    fail(what, "a number", got, hint or "give one number (a float), not a list, a string or None")


def numbers_of(what: str, got, names: tuple[str, ...]) -> list[float]:
    """``got`` as ``len(names)`` floats, or a CheckFailed naming what should have been returned, in order."""
    want = f"({', '.join(names)})"
    if not isinstance(got, (tuple, list, np.ndarray)) or np.ndim(got) != 1 or len(got) != len(names):
        fail(what, f"{len(names)} numbers: {want}", got, f"return the tuple {want}")
    return [number(f"{what}: {name}", g, f"{name} is one number") for name, g in zip(names, got)]


def _units(got: float, expected: float) -> str | None:
    """A power of a thousand between the answer and the truth is almost always a unit."""
    for factor in (1e3, 1e6, 1e9, 1e12):
        if expected and (close(got, expected * factor, rel=1e-6) or close(got, expected / factor, rel=1e-6)):
            return (f"off by a factor of {factor:g}: check the units (minidist is SI throughout: seconds, bytes, "
                    f"bytes per second, FLOP/s)")
    return None


def close(a: float, b: float, rel: float = 1e-9, abs_: float = 0.0) -> bool:
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=abs_)


def check_cases(name: str, fn: Callable, cases: Iterable[tuple[tuple, float, str]], rel: float = 1e-9,
                diagnose: Callable[[tuple, float, float], str | None] | None = None) -> None:
    """Call ``fn(*args)`` for each ``(args, expected, hint)`` and compare with relative tolerance ``rel``.

    ``diagnose(args, expected, got)`` may recognise a typical mistake and return a sharper hint.
    """
    n = 0
    for args, expected, hint in cases:
        got = attempt(name, fn, *args, hint=hint)
        got = number(f"{name}{_plain(args)}: expected a number", got)
        if not close(got, expected, rel=rel):
            better = (diagnose(args, expected, got) if diagnose else None) or _units(got, expected)
            fail(f"{name}{_plain(args)} is wrong", expected, got, better or hint)
        n += 1
    passed(f"{name}: {n} cases")


def passed(what: str) -> None:
    print(f"ok: {what}")
