# The two commands of the README: `make demo` and `make test`. Both set up .venv themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch 2.13.0 lies on local disk; any other spec downloads a multi-GB CUDA build.
TORCH := torch==2.13.0
# Real data for the tests that need it (../shared/data beside a checkout); unset if absent.
BERTKIT_DATA ?= $(abspath $(wildcard ../shared/data))
export BERTKIT_DATA

.PHONY: demo test test-fast lint typecheck bench clean browser

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(VENV)/.installed $@

demo: $(VENV)/.installed
	$(BIN)/bertkit demo

test: lint typecheck browser
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The attention page's test drives a headless Chromium. Found on PATH, or installed with apt-get
# where that is possible (root on Debian/Ubuntu, as in CI); elsewhere that one test skips and
# says so (install chromium by hand to run it).
BROWSERS := chromium chromium-browser google-chrome
browser:
	@for b in $(BROWSERS); do command -v $$b >/dev/null && exit 0; done; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing chromium for the attention page's test (apt-get)"; \
	  (apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || \
	   (apt-get update -q >/dev/null 2>&1 && \
	    apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1)) || \
	  echo "could not install chromium: the attention page's browser test will skip"; \
	else echo "no chromium: the attention page's browser test will skip (install chromium)"; fi

# The inner loop: everything but the tests marked slow (about half the wall time).
test-fast: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy src

bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/forward_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
