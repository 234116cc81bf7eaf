# The README's two commands: `make demo` (set up + main job) and `make test` (set up + tests).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo plots test lint typecheck unit clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[train,dev,tensorboard]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	mkdir -p out
	$(BIN)/shardmeter predict
	$(BIN)/shardmeter plan --topology eight-heterogeneous --plot out/plan-eight-heterogeneous.png
	$(BIN)/heloco simulate --out out/heloco-default

plots: $(STAMP)
	$(BIN)/python benchmarks/islands_plots.py
	$(BIN)/shardmeter plan --topology eight-heterogeneous --plot docs/img/plan-eight-heterogeneous.png

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -q

test: lint typecheck unit

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
