"""The code and tests speak of the course, not of the tracker: docstrings cite chapters and labs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# "issue 9", "issues 3 and 8", "Issue #12", "issue 8's": a number after the word is a tracker reference
TRACKER = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)


def _text_files():
    """Every file under minidist/ and tests/ that reads as text: code, docs, data (this file's pattern excepted)."""
    for path in sorted([*(ROOT / "minidist").rglob("*"), *(ROOT / "tests").rglob("*")]):
        if not path.is_file() or "__pycache__" in path.parts or path.resolve() == Path(__file__).resolve():
            continue
        try:
            yield path, path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue


def test_no_tracker_issue_numbers_in_code_or_tests():
    hits, seen = [], 0
    for path, text in _text_files():
        seen += path.suffix == ".py"
        for n, line in enumerate(text.splitlines(), 1):
            if TRACKER.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert seen > 100  # the walk found the package and its tests
    assert not hits, "cite the chapter or lab instead of a tracker issue:\n  " + "\n  ".join(hits)


def test_the_pattern_catches_tracker_references():
    for ref in ("landed with issue 9 (cp)", "see Issue #12", "issue 8's tp = 2 point", "issues 3 and 8", "ISSUE 6"):
        assert TRACKER.search(ref), ref
    for prose in ("an issue with the ring", "tissue 3", "issued 4 messages", "max(c.now when issued, link free)"):
        assert not TRACKER.search(prose), prose
