"""Load tests and benchmarks."""
