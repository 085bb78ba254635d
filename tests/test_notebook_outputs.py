"""Saved notebook outputs that every machine reproduces.

nbval compares what a solution notebook prints now with what it printed when it was saved. A number
whose last digits depend on the order of a floating-point sum (the BLAS kernel, the SIMD width of the
CPU, the number of threads) then fails on any machine but the one that saved it. So a cell that nbval
compares must print only what is true everywhere: exact integers, statements (``equal to 1e-12: True``),
and measured values rounded far above rounding noise; the cell asserts the precise numbers itself.

This test reads every untagged code cell's saved output and rejects the two shapes of number that
betray a machine-dependent value: a tiny magnitude in scientific notation (below 1e-9, the size of
rounding errors) and more than six significant digits after a decimal point. Integers (byte counts,
parameter counts) are exact and allowed, as is any number written literally in the cell's source (a
tolerance being printed, say).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "solutions").glob("*.ipynb"))
IGNORE = "nbval-ignore-output"
MAX_DIGITS = 6
TINY = 1e-9

# A decimal number with a fraction or an exponent; hex literals and digits inside words are not numbers.
NUMBER = re.compile(r"(?<![\w.])(?:\d[\d,]*)?\.?\d+(?:[eE][-+]?\d+)?(?![\w.])")


def _significant_digits(token: str) -> int:
    mantissa = re.split("[eE]", token)[0].replace(",", "").replace(".", "")
    return len(mantissa.lstrip("0"))


def suspicious_numbers(text: str, source: str = "") -> list[str]:
    """The numbers in ``text`` that look machine-dependent, each with the reason."""
    found = []
    text = re.sub(r"arXiv:\d{4}\.\d{4,5}", "arXiv", text)  # a citation, not a measurement
    for m in NUMBER.finditer(text):
        token = m.group(0)
        if "." not in token and "e" not in token.lower():
            continue  # an integer: exact on every machine
        if token in source:
            continue  # a constant written in the cell, e.g. a tolerance
        try:
            value = float(token.replace(",", ""))
        except ValueError:
            continue
        if "e" in token.lower() and 0 < abs(value) < TINY:
            found.append(f"{token} (a rounding-error-sized value)")
        elif _significant_digits(token) > MAX_DIGITS:
            found.append(f"{token} ({_significant_digits(token)} significant digits)")
    return found


def _output_text(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if "text" in out:
            parts.append("".join(out["text"]))
        elif "text/plain" in out.get("data", {}):
            parts.append("".join(out["data"]["text/plain"]))
    return "".join(parts)


def compared_cells(path: Path):
    """(index, source, output text) of every code cell whose output nbval compares."""
    nb = json.loads(path.read_text())
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code" or IGNORE in cell.get("metadata", {}).get("tags", []):
            continue
        src = cell["source"]
        yield i, "".join(src) if isinstance(src, list) else src, _output_text(cell)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_saved_outputs_do_not_depend_on_the_machine(path: Path):
    bad = []
    for i, source, text in compared_cells(path):
        for what in suspicious_numbers(text, source):
            bad.append(f"{path.name} cell {i}: prints {what}")
    assert not bad, ("these outputs differ between CPUs; print a statement or fewer digits and assert the "
                     "precise value in the cell:\n  " + "\n  ".join(bad))


@pytest.mark.parametrize("text, flagged", [
    ("max difference 8.9e-16", ["8.9e-16"]),
    ("losses [3.89902882 3.83795319]", ["3.89902882", "3.83795319"]),
    ("loss 4.156646", ["4.156646"]),
    ("13,078,528 bytes, 2020.00 us, bubble 0.2727", []),
    ("bits 0x47896058, 1.5e23 FLOP, 6.7 GB", []),
    ("fitted 450.0000 GB/s", ["450.0000"]),
    ("rank3 v2 at 9.9e-10", ["9.9e-10"]),
])
def test_the_scan_flags_what_varies_and_nothing_else(text, flagged):
    got = [w.split(" (")[0] for w in suspicious_numbers(text)]
    assert got == flagged


def test_a_number_written_in_the_source_is_a_constant():
    assert suspicious_numbers("equal to 1e-12: True", source="print(f'equal to 1e-12: {d < 1e-12}')") == []
    assert suspicious_numbers("equal to 1e-12: True") == ["1e-12 (a rounding-error-sized value)"]
