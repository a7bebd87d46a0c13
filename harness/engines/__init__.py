"""Whole-model engines: build a model card as a real Hugging Face model and run it.

Pure compute: nothing here knows about Hydra, CSV files or figures. The benchmarks in
harness/benchmarks/ call these and turn what they return into rows.
"""
