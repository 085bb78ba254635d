"""``import minidist`` loads only what a rank needs; the upper layers load on first use.

A rank started by spawn (macOS's and Windows' default start method) imports the package before it runs anything,
so every layer imported eagerly is paid once per rank per launch.
"""

from __future__ import annotations

import subprocess
import sys

LAZY = ("resilience", "parallel", "estimate", "profiling", "viz", "labs")


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          timeout=120).stdout.strip()


def test_importing_minidist_leaves_the_upper_layers_for_later():
    loaded = _run("import sys, minidist\n"
                  f"print(sorted(m for m in {LAZY!r} if 'minidist.' + m in sys.modules))")
    assert loaded == "[]"
    loaded = _run("import sys, minidist.runtime.rank_process\n"
                  f"print(sorted(m for m in {LAZY!r} if 'minidist.' + m in sys.modules))")
    assert loaded == "[]"


def test_the_upper_layers_are_there_on_first_use():
    out = _run("import minidist as md\n"
               "print(md.parallel.train.__name__, md.estimate.plan.__name__, callable(md.labs.check_design),\n"
               "      all(n in dir(md) for n in ('parallel', 'viz', 'labs')))")
    assert out == "train plan True True"


def test_in_an_ipython_shell_the_labs_error_messages_are_installed_at_once():
    out = _run("import IPython, sys\nimport minidist\nprint('minidist.labs' in sys.modules)")
    assert out == "True"
