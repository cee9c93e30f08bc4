"""``python -m bench``: the benchmark suite of issue 9 (see bench/run.py)."""

from bench.run import main

main()
