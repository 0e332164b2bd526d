# Off-Policy Lab: `make up` runs it, `make test` tests it, `make bench` measures it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# An unpinned torch may pull a multi-GB CUDA build; CPU-only machines pass e.g. TORCH_SPEC=torch==2.13.0.
TORCH_SPEC ?= torch
EXTRAS ?= dev

.PHONY: install up test lint bench

install: $(VENV)/.installed-$(EXTRAS)

$(VENV)/.installed-$(EXTRAS): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

# Embedded defaults without DATABASE_URL / REDIS_URL (SQLite and a filesystem broker under var/).
up: install
	$(BIN)/python manage.py up

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: install lint
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python bench/rl_step.py
	$(BIN)/python bench/dashboard.py
	$(BIN)/python bench/worker_threads.py
