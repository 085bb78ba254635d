"""The code and tests speak of the course, not of the tracker: docstrings cite chapters and labs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACKER = re.compile(r"\bissues?\s*#?\d+|\bissue\s*#\d+", re.IGNORECASE)


def test_no_tracker_issue_numbers_in_code_or_tests():
    hits = []
    for path in sorted([*(ROOT / "minidist").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]):
        if path.name == "test_style.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if TRACKER.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "cite the chapter or lab instead of a tracker issue:\n  " + "\n  ".join(hits)


def test_the_pattern_catches_tracker_references():
    assert TRACKER.search("landed with issue 9 (cp)") and TRACKER.search("see Issue #12")
    assert not TRACKER.search("an issue with the ring") and not TRACKER.search("tissue 3")
