"""A pytest plugin for the nbval run (``make test`` loads it with ``-p tests.nb_timing``).

It prints each solution notebook's total run time against the 30 s budget of a lab. It never fails
a run on timing: these machines are shared and noisy, so the budget is reported, not asserted.
"""

from __future__ import annotations

from collections import defaultdict

BUDGET_S = 30.0
_times: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report) -> None:
    path = report.nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        _times[path] += report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    if not _times:
        return
    terminalreporter.write_sep("-", f"notebook run times (budget {BUDGET_S:.0f} s each)")
    for path, seconds in sorted(_times.items()):
        flag = "  <-- over budget" if seconds > BUDGET_S else ""
        terminalreporter.write_line(f"{seconds:7.1f} s  {path}{flag}")
    terminalreporter.write_line(f"{sum(_times.values()):7.1f} s  in all")
