# grpo-companion: `make book` builds the executed book, `make test` runs every check.
# Both bootstrap .venv themselves; it is rebuilt when pyproject.toml or
# requirements.lock change (the stamp file name carries their hash).

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIN_HASH := $(shell cat pyproject.toml requirements.lock | sha256sum | cut -c1-16)
STAMP := $(VENV)/.installed-$(PIN_HASH)
export PYTHONHASHSEED := 0

.PHONY: book book-quick test lint unit browser-deps bench screenshots lock clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@echo "== setting up $(VENV) (pins $(PIN_HASH))"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@rm -f $(VENV)/.installed-*
	@touch $@

## The whole book, executed in full mode: _build/html/index.html
book: $(STAMP)
	$(PY) -m grpo_companion book

## Quick mode (small sizes), as CI runs it: _build/quick/html/index.html
book-quick: $(STAMP)
	$(PY) -m grpo_companion book --quick --out _build/quick

lint: $(STAMP)
	$(PY) -m ruff check .

unit: $(STAMP)
	$(PY) -m pytest -q -m "not book"

## Debian's chromium + chromedriver for the browser test (installed when missing)
browser-deps:
	@bash scripts/install-browser.sh

## Every check: lint, unit tests, quick book, built-HTML and browser tests
test: $(STAMP) browser-deps
	$(PY) -m ruff check .
	$(PY) -m pytest -q -m "not book"
	$(PY) -m grpo_companion book --quick --out _build/quick
	GRPO_BOOK_HTML=_build/quick/html $(PY) -m pytest -q -m book

## Headless-Chromium screenshots of every page (1400 px and 400 px wide) of the last built book
screenshots: $(STAMP) browser-deps
	$(PY) benchmarks/screenshots.py

bench: $(STAMP)
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

## Refresh requirements.lock from the current .venv (review the diff before committing)
lock: $(STAMP)
	$(PY) -m pip freeze --exclude-editable | grep -v '^torch==' \
	  | { echo "# Full pinned environment (pip constraints) for grpo-companion, Python 3.11."; \
	      echo "# Regenerate: make lock (then review the diff). Direct dependencies are pinned in pyproject.toml."; \
	      echo "torch==2.13.0"; cat; } > requirements.lock.tmp && mv requirements.lock.tmp requirements.lock

clean:
	rm -rf _build
