# plansight: `make help` lists the targets.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SWEEP  ?= collect/sweeps/default.yaml
export PYTHONWARNINGS ?= ignore::FutureWarning

.DEFAULT_GOAL := help
PORT   ?= 8000
MODEL  ?= models:/plansight@champion
WORKLOAD ?= experiments/requests/gpt-20l-1536.json
CLUSTER  ?= a100-80gb
.PHONY: help install engines browser lint test test-unit test-collect test-gnn test-serve test-engines collect dataset evaluate \
        train ship-champion recalibrate tune bench serve mlflow-serve search render demo clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

install: $(STAMP) ## create or refresh the virtualenv with pinned dependencies (idempotent)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first and exactly pinned, so nothing later resolves a CUDA build
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[dev]'
	# the CPU counting allocator, compiled now so that no measurement needs a compiler (without one: a line saying
	# what to install, and CPU peaks read from the RSS high-water mark, labelled so)
	$(PY) -m collect.measure.cpu_alloc --build
	touch $(STAMP)

lint: install ## ruff: the checks and the formatting configured in pyproject.toml (tests/house runs them too)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# what the tests start besides the virtualenv, from Debian's archive when root (else those tests skip, saying why):
# $(call apt_install,commands,packages,which tests)
define apt_install
	@if $(foreach c,$(1),command -v $(c) >/dev/null &&) true; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2) >/dev/null) \
	  || echo "apt-get could not install $(2): $(3) will skip"; \
	else echo "no $(1), and not root with apt-get: $(3) will skip (apt-get install $(2))"; fi
endef

# PostgreSQL is on these machines; SLURM is installed here
engines: ## install SLURM and munge for tests/engines (apt-get, as root); without them those tests skip, saying why
	$(call apt_install,slurmctld munged,slurm-wlm munge,the SLURM tests)

browser: ## install Debian's chromium for tests/explorer (apt-get, as root); Playwright (pinned) drives it
	$(call apt_install,chromium,chromium,the browser tests)

test: install engines browser ## run the whole test suite (tests/engines starts its own SLURM, PostgreSQL and MLflow server)
	$(PY) -m pytest tests -q --durations=15

test-unit: install ## fast single-process tests only
	$(PY) -m pytest tests -q -m "not distributed and not engines"

test-collect: install ## multi-rank collection tests (real gloo ranks)
	$(PY) -m pytest tests -q -m distributed

test-gnn: install ## execution graph, simulator, baselines, the surrogate and its tracking
	$(PY) -m pytest tests/gnn tests/model -q

test-serve: install ## the HTTP service over real HTTP, the CLI and the plan search
	$(PY) -m pytest tests/serve -q

test-engines: install engines ## SLURM, PostgreSQL search workers, an MLflow server, Lightning DDP, two-node torchrun
	$(PY) -m pytest tests -q -m engines

# an active sweep's plans are chosen by a surrogate, which lives in gnn (collect imports no model)
ACTIVE = $(shell grep -qE '^sampler:[[:space:]]*active' $(SWEEP) 2>/dev/null && echo yes)

collect: install ## run a sweep and append its rows to data/ (SWEEP=path.yaml, default: a few minutes)
	$(PY) -m $(if $(ACTIVE),gnn.acquire,collect sweep) $(SWEEP)

dataset: install ## build (or load the cached) graph dataset from data/runs
	$(PY) -m gnn.dataset

evaluate: install ## every predictor on every split: prints the table, writes experiments/results/evaluation.json
	$(PY) -m experiments.evaluate

train: install ## train the GNN ensemble on all/random, log to MLflow (MLFLOW_TRACKING_URI; sqlite:///mlflow.db) [TRAIN_ARGS=]
	$(PY) -m gnn.train $(TRAIN_ARGS)

ship-champion: install ## write $(MODEL) to models/champion (weights, data/code versions, reference predictions, the new-cluster calibration)
	$(PY) -m gnn.tracking.shipped export --model $(MODEL) --new-source experiments/results/loso_rows.csv

recalibrate: install ## refit models/champion's new-cluster calibration on experiments/results/loso_rows.csv (weights unchanged)
	$(PY) -m gnn.tracking.shipped recalibrate --new-source experiments/results/loso_rows.csv

tune: install ## Optuna search of the GNN's hyper-parameters (sqlite:///optuna.db, resumable; TRIALS=20)
	$(PY) -m gnn.tune --trials $${TRIALS:-20}

bench: install ## inference speed of the champion (plans/s, graph building included)
	$(PY) -m experiments.bench.inference

serve: install ## HTTP service on 127.0.0.1:$(PORT) for $(MODEL) (docs at /docs)
	$(PY) -m serve serve --port $(PORT) --model $(MODEL)

# MLflow's own scoring server runs `uvicorn` by name: the virtualenv's bin goes first on PATH
mlflow-serve: install ## MLflow's scoring server for $(MODEL) on 127.0.0.1:$(PORT) (POST /invocations)
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/mlflow models serve -m $(MODEL) --env-manager local \
	    --host 127.0.0.1 --port $(PORT)

search: install ## plan search through the surrogate: WORKLOAD=file.json CLUSTER=preset|json [NODES= OBJECTIVE= TRIALS= FRAMEWORK=]
	$(PY) -m serve search --workload $(WORKLOAD) --cluster '$(CLUSTER)' --nodes $${NODES:-1} \
	    --objective $${OBJECTIVE:-time} --trials $${TRIALS:-200} --framework $${FRAMEWORK:-torch} --model $(MODEL) \
	    --plot build/search.png

render: install ## draw a small plan's simulated timeline to docs/img/timeline.png
	$(PY) -m gnn.render

demo: install ## the main job end to end on the shipped data: champion (or train one), accuracy table, a plan search
	$(PY) -m experiments.demo

clean: ## remove the virtualenv and caches (keeps data/)
	rm -rf $(VENV) build .pytest_cache
