# plansight: `make help` lists the targets.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SWEEP  ?= collect/sweeps/default.yaml
export PYTHONWARNINGS ?= ignore::FutureWarning

.DEFAULT_GOAL := help
.PHONY: help install test test-unit test-collect collect demo clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

install: $(STAMP) ## create or refresh the virtualenv with pinned dependencies (idempotent)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first and exactly pinned, so nothing later resolves a CUDA build
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

test: install ## run the whole test suite
	$(PY) -m pytest tests -q

test-unit: install ## fast single-process tests only
	$(PY) -m pytest tests -q -m "not distributed"

test-collect: install ## multi-rank collection tests (real gloo ranks)
	$(PY) -m pytest tests -q -m distributed

collect: install ## run a sweep and append its rows to data/ (SWEEP=path.yaml, default: a few minutes)
	$(PY) -m collect sweep $(SWEEP)

demo: install ## the main job end to end on the embedded default: a small local collection and its table
	$(PY) -m experiments.demo

clean: ## remove the virtualenv and caches (keeps data/)
	rm -rf $(VENV) build .pytest_cache
