"""Trace-driven simulator of the pool: spot capacity over time, the same policy code."""
