"""Benchmarks behind `make bench`; each writes its section of docs/benchmarks.md."""
