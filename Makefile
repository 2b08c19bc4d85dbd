# grpo-companion: `make book` builds the executed book, `make test` runs every check.
# Both bootstrap .venv themselves; it is rebuilt when pyproject.toml or
# requirements.lock change, or the torch build (the stamp file name carries their hash).
#
# TORCH=auto (default): the CUDA build of torch when an NVIDIA driver is present, else CPU;
# TORCH=cpu or TORCH=cuda to choose (scripts/torch_build.py), e.g. `make book TORCH=cpu`.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH ?= auto
TORCH_BUILD := $(shell $(PYTHON) scripts/torch_build.py choose '$(TORCH)')
ifeq ($(TORCH_BUILD),)
$(error no torch build for TORCH=$(TORCH): TORCH is auto, cpu or cuda, and PYTHON=$(PYTHON) must run)
endif
# sha256sum (Linux) or shasum (macOS)
PIN_HASH := $(shell { cat pyproject.toml requirements.lock; echo "torch build: $(TORCH_BUILD)"; } \
	| { command -v sha256sum >/dev/null && sha256sum || shasum -a 256; } | cut -c1-16)
STAMP := $(VENV)/.installed-$(PIN_HASH)
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
export PYTHONHASHSEED := 0
# rerun by `make test` with numpy's SIMD dispatch off (scripts/limited_simd.py)
NUMERIC_TESTS := tests/theory tests/symbolic tests/variants

.PHONY: book book-quick test lint unit browser-deps bench screenshots lock clean venv lab

venv: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@echo "== setting up $(VENV) (pins $(PIN_HASH), torch $(TORCH_BUILD) build, TORCH=$(TORCH))"
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	  || { echo "$(PYTHON) is older than Python 3.11: make ... PYTHON=python3.11" >&2; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) scripts/torch_build.py install $(TORCH_BUILD)
	$(PIP) -r requirements.lock
	$(PIP) --no-deps --no-build-isolation -e .
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

## A Chrome, Chromium or Edge and its driver for the browser test (scripts/find_browser.py):
## found on the PATH or in the usual places, driver from Selenium Manager when online, else
## installed with apt-get or dnf when that needs no prompt; otherwise one line says what to install
browser-deps: $(STAMP)
	@$(PY) scripts/find_browser.py --install

## Every check: lint, unit tests, quick book, built-HTML and browser tests
test: $(STAMP) browser-deps
	$(PY) -m ruff check .
	$(PY) -m pytest -q -m "not book"
	@# another CPU's rounding: the numeric tests again on numpy's baseline kernels (no SIMD dispatch)
	NPY_DISABLE_CPU_FEATURES="$$($(PY) scripts/limited_simd.py)" bash -c \
	  '$(PY) scripts/limited_simd.py --check && $(PY) -m pytest -q -p no:cacheprovider $(NUMERIC_TESTS)'
	@# the matplotlib setting that once hid every figure: the book must not care
	MPLBACKEND=Agg $(PY) -m grpo_companion book --quick --out _build/quick
	GRPO_BOOK_HTML=_build/quick/html $(PY) -m pytest -q -m book

## JupyterLab on the chapters: a chapter (.md) opens as a notebook (jupytext), its MyST
## directives and math rendered (jupyterlab-myst); lab/labconfig sets that default viewer.
## Run the cells top to bottom; LAB_PORT=8890 make lab to change the port
LAB_PORT ?= 8888
lab: $(STAMP)
	JUPYTER_CONFIG_PATH="$(CURDIR)/lab$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	  $(PY) -m jupyter lab --ServerApp.root_dir="$(CURDIR)" --port=$(LAB_PORT) \
	  $(if $(filter 0,$(shell id -u)),--allow-root) chapters/01_calibration.md

## Headless-Chromium screenshots of every page (1400 px and 400 px wide) of the last built book
screenshots: $(STAMP) browser-deps
	$(PY) benchmarks/screenshots.py

## The whole book as one PDF (XeLaTeX, through Jupyter Book's pdflatex builder):
## _build/pdf/book.pdf, from the executed notebooks that `make book` caches in _build.
## The Debian packages of scripts/tex_packages.txt are installed with apt-get when missing and
## that needs no prompt (scripts/install_tex.py); otherwise one line says what to install
.PHONY: pdf student
pdf: $(STAMP)
	@$(PY) scripts/install_tex.py --install
	$(PY) -m grpo_companion pdf
	@pdfinfo _build/pdf/book.pdf | grep -E '^(Pages|File size):'

## The student edition: each chapter as a notebook (.ipynb) with its exercises, without their
## solutions, and a starter cell for each coding exercise: _build/student/
student: $(STAMP)
	$(PY) -m grpo_companion student

bench: $(STAMP)
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

## Refresh requirements.lock from the current .venv (review the diff before committing);
## torch is pinned by hand and a CUDA build's own libraries stay out, so both builds share it
lock: $(STAMP)
	$(PY) -m pip freeze --exclude-editable | grep -Ev '^(torch|triton|nvidia-[^=]*|cuda-[^=]*)==' \
	  | { echo "# Full pinned environment (pip constraints) for grpo-companion, Python 3.11."; \
	      echo "# Regenerate: make lock (then review the diff). Direct dependencies are pinned in pyproject.toml."; \
	      echo "torch==2.13.0"; cat; } > requirements.lock.tmp && mv requirements.lock.tmp requirements.lock

clean:
	rm -rf _build
