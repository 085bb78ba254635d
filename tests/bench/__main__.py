"""Run every benchmark: ``python -m tests.bench [name ...]`` (names like ``autograd``, ``collectives``)."""

import importlib
import pkgutil
import sys
import time
import traceback

import tests.bench as pkg


def main(argv: list[str]) -> int:
    names = sorted(m.name[len("bench_"):] for m in pkgutil.iter_modules(pkg.__path__) if m.name.startswith("bench_"))
    chosen = argv or names
    failed = []
    for name in chosen:
        print(f"\n=== bench: {name} ===", flush=True)
        t0 = time.perf_counter()
        try:
            importlib.import_module(f"tests.bench.bench_{name}").main()
        except Exception:
            traceback.print_exc()
            failed.append(name)
        print(f"--- {name}: {time.perf_counter() - t0:.1f} s wall", flush=True)
    if failed:
        print("benchmarks that raised:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
