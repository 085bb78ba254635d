"""Run a lab notebook top to bottom in a fresh kernel, the way ``make test`` runs it.

The environment is the course's everywhere: one BLAS thread per process (faster with several ranks
on few cores, and the same summation order as the saved outputs) and the notebook's own folder as the
working directory; figures are drawn inline as in JupyterLab. Execution goes on after a failing cell,
so a caller sees every cell's result.

Authors refresh a solution notebook's saved outputs with::

    python -m minidist.labs.execute --save solutions/04_scaling_laws.ipynb
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

SERIAL_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
CELL_TIMEOUT_S = 180  # a lab's cells take seconds; a stuck one is interrupted instead of waited for


def course_env() -> dict[str, str]:
    """This process's environment with the course's settings (one BLAS thread per process)."""
    env = dict(os.environ, **SERIAL_ENV)
    env.pop("MPLBACKEND", None)  # the kernel's inline backend keeps the figures in the saved notebook
    return env


KERNEL_STARTS = 3


def start_kernel(client, env: dict[str, str]) -> None:
    """Start ``client``'s kernel and connect to it.

    jupyter_client picks free TCP ports and the kernel binds them a moment later; a process that takes one of
    them in between (likely while tests start kernels side by side) makes the kernel die before it answers. Only
    that failure is retried, with fresh ports, up to ``KERNEL_STARTS`` times.
    """
    for attempt in range(KERNEL_STARTS):
        client.km = client.create_kernel_manager()
        try:
            client.start_new_kernel(env=env)
            client.start_new_kernel_client()  # on failure it has already shut the kernel down
            return
        except RuntimeError as e:
            if "died before replying" not in str(e) or attempt == KERNEL_STARTS - 1:
                raise


def stop_kernel(client, grace: float = 30.0) -> None:
    """Shut ``client``'s kernel down, if one is still there.

    jupyter_client's shutdown interrupts the kernel before asking it to stop, and an idle kernel that gets the
    interrupt logs "KeyboardInterrupt caught in kernel" as an ERROR on the learner's terminal. So the kernel is
    first asked alone, and given ``grace`` seconds to exit; only one that is still there is shut down that way.
    An answering kernel exits in well under a second on a quiet machine, but took over 3 s while other notebooks
    and tests shared two cores, and over 10 s once in a fresh virtual environment under that load (its output
    flush timed out first); only a kernel that ignores the request waits the whole grace.
    """
    if client.km is None:
        return
    kc = getattr(client, "kc", None)
    try:
        if kc is not None:
            from nbclient.util import run_sync  # nbclient's manager is asynchronous

            alive = run_sync(client.km.is_alive)
            if alive():
                kc.shutdown()
                end = time.monotonic() + grace
                while alive() and time.monotonic() < end:
                    time.sleep(0.02)
    finally:
        client._cleanup_kernel()


def run_notebook(path: Path, timeout: float = CELL_TIMEOUT_S):
    """Execute every code cell of ``path`` in a new kernel; return the executed ``nbformat`` notebook.

    A cell that raises keeps its error output and execution continues with the next cell; a cell still
    running after ``timeout`` seconds is interrupted (a KeyboardInterrupt in its output) and the run goes on.
    """
    try:
        import nbclient
        import nbformat
    except ImportError as e:  # pragma: no cover - both come with jupyterlab
        raise RuntimeError(f"running a notebook needs nbclient and nbformat (installed with jupyterlab): {e}") from e
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    # The kernel's own log says at every start that it talks over local TCP without encryption (true of every
    # local kernel, and noise above a learner's results); errors still show. What the cells print is unaffected.
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                                     record_timing=False, interrupt_on_timeout=True,
                                     extra_arguments=["--IPKernelApp.log_level=ERROR"],
                                     resources={"metadata": {"path": str(path.resolve().parent)}})
    for cell in nb.cells:
        cell.metadata.pop("execution", None)  # timestamps of an earlier run: noise in a diff
    try:
        start_kernel(client, course_env())
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                client.execute_cell(cell, i)
    finally:
        stop_kernel(client)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = _coalesce_streams(cell.outputs)
    return nb


def _coalesce_streams(outputs: list) -> list:
    """Join consecutive prints to the same stream into one output, as JupyterLab saves them."""
    merged = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if (out.get("output_type") == "stream" and prev is not None and prev.get("output_type") == "stream"
                and prev.get("name") == out.get("name")):
            prev["text"] += out["text"]
        else:
            merged.append(out)
    return merged


def errors(nb) -> list[tuple[int, str, str]]:
    """(cell index, exception name, message) of every cell that raised."""
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.get("output_type") == "error":
                found.append((i, out.get("ename", "?"), out.get("evalue", "")))
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--save", action="store_true", help="write the outputs back into the notebook")
    args = ap.parse_args(argv)
    import nbformat

    status = 0
    for path in args.notebooks:
        nb = run_notebook(path)
        failed = errors(nb)
        for i, ename, evalue in failed:
            print(f"{path}: cell {i} raised {ename}: {evalue.splitlines()[0] if evalue else ''}")
        if failed:
            status = 1
            print(f"{path}: not saved (a cell failed)" if args.save else f"{path}: {len(failed)} cell(s) failed")
        elif args.save:
            nbformat.write(nb, path)
            print(f"{path}: saved")
        else:
            print(f"{path}: ran to the end")
    return status


if __name__ == "__main__":
    sys.exit(main())
