# plansight: `make help` lists the targets.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SWEEP  ?= collect/sweeps/default.yaml
export PYTHONWARNINGS ?= ignore::FutureWarning

.DEFAULT_GOAL := help
.PHONY: help install test test-unit test-collect test-gnn collect dataset evaluate train render demo clean

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

test-gnn: install ## execution graph, simulator and baseline tests
	$(PY) -m pytest tests/unit/test_graph.py tests/unit/test_simulate.py tests/unit/test_baselines.py -q

collect: install ## run a sweep and append its rows to data/ (SWEEP=path.yaml, default: a few minutes)
	$(PY) -m collect sweep $(SWEEP)

dataset: install ## build (or load the cached) graph dataset from data/runs
	$(PY) -m gnn.dataset

evaluate: install ## every predictor on every split: prints the table, writes experiments/results/evaluation.json
	$(PY) -m experiments.evaluate

train: install ## train the GNN surrogate on the cpu/random split, log to MLflow (sqlite:///mlflow.db), register if better
	$(PY) -m gnn.train

render: install ## draw a small plan's simulated timeline to docs/img/timeline.png
	$(PY) -m gnn.render

demo: install ## the main job end to end on the embedded default: a small local collection and its table
	$(PY) -m experiments.demo

clean: ## remove the virtualenv and caches (keeps data/)
	rm -rf $(VENV) build .pytest_cache
