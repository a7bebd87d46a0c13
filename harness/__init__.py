"""Benchmark and artifact-reproduction harness for the Tilus and Proton papers."""
