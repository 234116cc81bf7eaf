# The README's two commands: `make demo` (set up + main job) and `make test` (set up + tests).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo plots test test-fast lint typecheck unit unit-fast browser clean

# -qq: pip prints errors only, so a first `make demo` shows the demo rather than install notes.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -qq --upgrade pip
	$(BIN)/pip install -qq -e ".[train,dev,tensorboard,ray,html]"
	touch $(STAMP)

setup: $(STAMP)

# About one screen per step; each step's full output is one flag away (--wide, --json).
demo: $(STAMP)
	@mkdir -p out
	@echo "== 1/3 shardmeter predict: Llama-3.1-8B on one 8-GPU H100 node"
	@$(BIN)/shardmeter predict
	@echo
	@echo "== 2/3 shardmeter plan: the best plans over eight heterogeneous islands"
	@$(BIN)/shardmeter plan --topology eight-heterogeneous --top 1 --no-progress \
		--plot out/plan-eight-heterogeneous.png
	@echo
	@echo "== 3/3 heloco simulate: five workers, two at half speed, one language each"
	@$(BIN)/heloco simulate --out out/heloco-default --overwrite
	@echo
	@echo "Next: . $(VENV)/bin/activate, then shardmeter --help, heloco --help, README.md"

plots: $(STAMP)
	$(BIN)/python benchmarks/islands_plots.py
	$(BIN)/shardmeter plan --topology eight-heterogeneous --plot docs/img/plan-eight-heterogeneous.png

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP) browser
	$(BIN)/pytest -q

# Headless Chromium for tests/test_html_pages.py: the distribution's package, installed when
# missing where we are root and apt works (CI runs as root on Debian); elsewhere the browser
# tests skip and say why.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends chromium fonts-dejavu-core >/dev/null; } || \
	  echo "chromium not installed: the browser tests will skip"; }

# The full suite (what CI runs).
test: lint typecheck unit

# The fast lane: everything not marked slow (subprocesses, multi-process runs, docs, demo,
# CLI fuzzing, tests over ~1 s); about 2 minutes on 2 cores. `make test` before merging.
unit-fast: $(STAMP)
	$(BIN)/pytest -q -m "not slow"

test-fast: lint typecheck unit-fast

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
