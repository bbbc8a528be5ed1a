# QLM developer targets. `make help` lists them.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip==26.3
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install qlm with its pinned dependencies

run: $(STAMP) ## the main job: group, estimate and plan a mixed queue on the embedded default
	$(BIN)/qlm plan examples/plan.yaml

lint: $(STAMP) ## ruff format check, ruff lint, mypy --strict
	$(BIN)/ruff format --check qlm tests benchmarks
	$(BIN)/ruff check qlm tests benchmarks
	$(BIN)/mypy

fmt: $(STAMP) ## format the code
	$(BIN)/ruff format qlm tests benchmarks
	$(BIN)/ruff check --fix qlm tests benchmarks

test: lint ## lint, then the whole test suite
	$(BIN)/pytest -q

bench: $(STAMP) ## planner and grouping benchmarks; writes docs/benchmarks.md
	$(BIN)/python benchmarks/solver.py

.PHONY: help install run lint fmt test bench
