"""Registered benchmarks; importing this package registers them all."""
from . import instrumentation, matmul  # noqa: F401
