"""Registered benchmarks; importing this package registers them all."""
from . import matmul  # noqa: F401
