"""``python -m bench``: the benchmark suite (see bench/run.py)."""

from bench.run import main

main()
