"""Benchmarks (`make bench`): each ``bench_*.py`` here has a ``main()`` that prints its numbers."""
