"""gpchol's benchmark suite: ``python -m benchmarks [--quick] [--scale]`` (see run.py)."""
