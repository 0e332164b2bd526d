# Off-Policy Lab: `make up` runs it, `make test` tests it (all of it), `make test-fast` tests what
# starts no browser, worker or other process (a few minutes, for iteration), `make bench` measures it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS ?= dev
# torch comes first and alone, so nothing later pulls a multi-GB CUDA build by accident:
# - on a machine without an NVIDIA GPU (and without EXTRAS=gpu) a CPU-only build: torch==2.13.0 is
#   the CPU build on this project's package index; elsewhere point TORCH_INDEX at PyTorch's CPU wheel index;
# - with an NVIDIA GPU or EXTRAS=gpu, the registry's default (CUDA) build, as vLLM expects.
HAS_NVIDIA_GPU := $(shell (test -e /proc/driver/nvidia/version || nvidia-smi -L >/dev/null 2>&1) && echo yes)
ifneq ($(HAS_NVIDIA_GPU)$(findstring gpu,$(EXTRAS)),)
TORCH_SPEC ?= torch
TORCH_FLAVOUR := cuda
else
TORCH_SPEC ?= torch==2.13.0
TORCH_FLAVOUR := cpu
endif
TORCH_INDEX ?=
TORCH_PIP_ARGS := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))

.PHONY: install up test test-fast lint bench chromium slurm mlflow

install: $(VENV)/.installed-$(EXTRAS)

$(VENV)/.installed-$(EXTRAS): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	@if [ "$(TORCH_FLAVOUR)" = cpu ] && $(BIN)/python -m pip list 2>/dev/null | grep -Eiq '^(nvidia|cuda)-'; then \
	    echo "error: CUDA wheels were installed into $(VENV) on a machine without an NVIDIA GPU;" >&2; \
	    echo "       remove $(VENV) and pass a CPU-only torch (TORCH_SPEC=... or TORCH_INDEX=<PyTorch CPU index>)" >&2; \
	    exit 1; fi
	touch $@

# Embedded defaults without DATABASE_URL / REDIS_URL (SQLite and a filesystem broker under var/).
up: install
	$(BIN)/python manage.py up

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The browser tests drive Debian's Chromium through Playwright; never a downloaded browser.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	    if [ "$$(id -u)" = 0 ]; then \
	        echo "installing Debian's chromium for the browser tests"; \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	    else \
	        echo "error: the browser tests need Debian's chromium: sudo apt-get install chromium" >&2; exit 1; \
	    fi; }

# The Slurm test (tests/platform/workers/test_slurm.py) starts a one-node cluster of Debian's
# slurm-wlm (slurmctld, slurmd) and munge on 127.0.0.1 for the sbatch scripts of deploy/slurm/.
slurm:
	@{ command -v sbatch && command -v slurmctld && command -v slurmd && command -v munged; } >/dev/null 2>&1 || { \
	    if [ "$$(id -u)" = 0 ]; then \
	        echo "installing Debian's slurm-wlm and munge for the Slurm test"; \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; \
	    else \
	        echo "error: the Slurm test needs Debian's slurm-wlm and munge: sudo apt-get install slurm-wlm munge" >&2; exit 1; \
	    fi; }

# The mirror test (tests/platform/imports) starts a real MLflow tracking server on 127.0.0.1, and the
# MLflow import test exports a run with mlflow-export-import; MLflow pins gunicorn<27, which the
# web app cannot take, so they have a venv of their own.
mlflow: .venv-mlflow/.installed

.venv-mlflow/.installed:
	test -x .venv-mlflow/bin/python || $(PYTHON) -m venv .venv-mlflow
	.venv-mlflow/bin/python -m pip install -q "mlflow>=3" mlflow-export-import tabulate
	touch $@

test: install lint chromium slurm mlflow
	$(BIN)/python -m pytest

# The tests marked by what they start (tests/conftest.py) left out: Chromium, Celery workers, any
# other process. `make test` still runs everything, and is what CI runs.
test-fast: install
	$(BIN)/python -m pytest -m "not browser and not workers and not subprocess"

bench: install
	$(BIN)/python bench/rl_step.py
	$(BIN)/python bench/update_cost.py
	$(BIN)/python bench/dashboard.py
	$(BIN)/python bench/dashboard.py --grid team
	$(BIN)/python bench/run_query.py
	$(BIN)/python bench/worker_threads.py
	$(BIN)/python bench/async_speedup.py
	$(BIN)/python bench/pages.py
