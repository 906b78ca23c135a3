# The two README commands are `make run` (whole pipeline on the embedded default) and `make test`.
# Both set up .venv first (idempotent: a stamp file records the installed pyproject).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
UV := $(VENV)/bin/uv
UV_VERSION := 0.13.8
# What was installed: the project's dependencies and the versions they were locked at (constraints.txt).
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)
# Where pip finds the CPU torch wheel on this machine (its find-links); uv is pointed at the same place.
TORCH_FIND_LINKS ?= $(shell pip config get global.find-links 2>/dev/null)

# One thread per process: 2 cores here, and DeepSpeed ranks oversubscribe without it (docs/environment.md).
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export DVC_NO_ANALYTICS ?= 1
export PREFECT_HOME ?= $(CURDIR)/.prefect
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions
export HF_HUB_OFFLINE ?= 1
export PYTHONUNBUFFERED := 1
# Python keeps the bytecode of what it imports (`__pycache__`), so torch, transformers and DeepSpeed are compiled once
# per venv, not by every process: with PYTHONDONTWRITEBYTECODE set (as on the machine this was built on) each stage
# process compiled them again, 19 s instead of 8 s to import them (docs/environment.md). .dvcignore keeps the caches
# out of the stages' code deps.
unexport PYTHONDONTWRITEBYTECODE
# The venv's bin first: one ninja builds DeepSpeed's JIT ops for every process (docs/environment.md).
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup lock run test test-heavy test-fast lint bench clean serve dry-run gpu-wheels gpu-check

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	# uv installs (pip took 4 min 30 s for the same set on 2 cores, uv about 40 s; docs/environment.md).
	# Where uv cannot be installed or cannot reach the index, each step falls back to pip (same versions, slower).
	test -x $(UV) || $(PIP) install -q "uv==$(UV_VERSION)" || echo "uv not installed: setting up with pip"
	# CPU torch first (the wheel on disk here); a GPU user installs their CUDA torch instead (docs/gpu.md).
	$(UV) pip install --python $(PY) -q $(addprefix --find-links ,$(TORCH_FIND_LINKS)) "torch==2.13.0" \
	  || $(PIP) install -q "torch==2.13.0"
	# Everything else at the versions constraints.txt locks (resolved once, not at every setup).
	$(UV) pip install --python $(PY) -q -c constraints.txt -e ".[dev]" || $(PIP) install -q -c constraints.txt -e ".[dev]"
	# PySceneDetect without its opencv-python dependency (it would delete cv2 of opencv-python-headless).
	$(UV) pip install --python $(PY) -q --no-deps "scenedetect==0.7.2" || $(PIP) install -q --no-deps "scenedetect==0.7.2"
	# lmms-eval for the parity test of our readers of its answers (tests/evaluation/test_lmms_parity.py), without its
	# dependencies (large, and they clash with ours): the test loads its task files by path, never the package.
	$(UV) pip install --python $(PY) -q --no-deps "lmms-eval==0.7.3" || $(PIP) install -q --no-deps "lmms-eval==0.7.3"
	# The check imports every framework (in two processes: each writes the bytecode later processes read) while
	# Prefect's local database is created (the flow's temporary server would migrate it first: ~8 s of `make run`).
	$(VENV)/bin/prefect server database upgrade -y >/dev/null 2>&1 & db=$$!; \
	$(PY) -c "import torch, deepspeed, transformers" & heavy=$$!; \
	$(PY) -c "import cv2, torch, apache_beam, prefect, mlflow, scenedetect; print('env ok: torch', torch.__version__, 'cv2', cv2.__version__)" \
	  && wait $$heavy && { wait $$db || echo "Prefect's database not created now: the first flow run creates it"; }
	rm -f $(VENV)/.installed-*; touch $@

# Re-lock the dependency versions (constraints.txt) after pyproject.toml's dependencies change; commit the file.
lock:
	test -x $(UV) || { test -x $(PY) || python3.11 -m venv $(VENV); $(PIP) install -q "uv==$(UV_VERSION)"; }
	$(UV) pip compile -q pyproject.toml --extra dev $(addprefix --find-links ,$(TORCH_FIND_LINKS)) \
	  -c <(echo "torch==2.13.0") --python-version 3.11 --no-annotate --custom-compile-command "make lock" \
	  -o constraints.txt
	# torch is not locked: the CPU wheel is installed first, and a GPU user's CUDA torch must stay (docs/gpu.md).
	sed -i '/^torch==/d' constraints.txt

# The whole pipeline on the embedded default (Prefect's ephemeral API, SQLite MLflow, local DVC remote).
run: setup
	$(PY) -m flows $(ARGS)

# The served path: Prefect server + MLflow server + the deployments, all on 127.0.0.1 (Ctrl-C stops them).
# Then: PREFECT_API_URL=http://127.0.0.1:4200/api .venv/bin/prefect deployment run 'post-training/default'
serve: setup
	$(PY) -m flows.serve $(ARGS)

# Two pytest workers (pytest-xdist): a file's tests share one worker, long groups are ordered in tests/conftest.py
# (docs/testing.md). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: setup
	$(PY) -m pytest -q -m "not heavy" $(XDIST) $(ARGS)

# The heavy shape-true runs (Qwen3-VL-8B full fine-tuning and Qwen3.5-2B at world size 2, the Qwen3-VL-2B GPU-check
# dry run): ~10 min of worker time that `make test` leaves out (docs/testing.md).
test-heavy: setup
	$(PY) -m pytest -q -m heavy $(XDIST) $(ARGS)

test-fast: setup
	$(PY) -m pytest -q -m "not slow" $(XDIST) $(ARGS)

# Every benchmark in benchmarks/, run as `python -m benchmarks.<name>` (each prints ratios against baselines measured
# in the same run and writes them, with date, commit and load average, to reports/bench/<name>.json), then one table
# of all ratios. Long: the preprocess one alone took ~20 min here (112- and 448-px corpora of 1200 videos).
# A subset or other sizes: make bench BENCHMARKS="train rl" BENCH_ARGS_preprocess="--n-videos 600 --size 448"
BENCHMARKS ?= $(filter-out __init__ figures,$(basename $(notdir $(wildcard benchmarks/*.py))))
bench: setup
	set -e; $(foreach b,$(BENCHMARKS),echo "== benchmarks.$(b)"; $(PY) -m benchmarks.$(b) $(BENCH_ARGS_$(b));) \
	  $(PY) -m benchmarks.figures

dry-run: setup
	$(PY) -m vtg.config $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .

# Moves the pipeline's outputs aside (nothing is deleted: checkpoints and data are the user's); say where.
clean:
	@stamp=$$(date -u +%Y%m%dT%H%M%SZ); dest=.trash/$$stamp; mkdir -p $$dest; \
	for p in data/interim data/shards checkpoints reports mlruns mlflow.db .prefect .serve; do \
	  if [ -e $$p ]; then mkdir -p $$dest/$$(dirname $$p); mv $$p $$dest/$$p; fi; done; \
	echo "moved the outputs aside to $$dest (delete it yourself once you are sure)"

# The GPU check (training/gpu_check.py) on the lent GPU machine (Python 3.12, torch/transformers/peft there, no
# network). Here: `make gpu-wheels` puts the pure-Python packages it lacks into .whl/ (git-ignored, ~28 MB;
# dashscope only for its data file, the real Qwen BPE ranks).
# There (the device command carries `.whl`): `make gpu-check` (< 8 min on one H200; never part of CI).
GPU_WHEELS := pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
	hjson==3.1.0 webdataset==1.0.2 braceexpand==0.1.7 transformers==5.24.0 dashscope==2.0.2
gpu-wheels: setup
	rm -rf .whl && mkdir -p .whl
	$(PIP) download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d .whl $(GPU_WHEELS)
	$(PIP) wheel -q --no-deps --no-build-isolation -w .whl deepspeed==0.19.8
	du -sh .whl

gpu-check:
	python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/vtg-site .whl/*.whl
	PYTHONPATH=/tmp/vtg-site:$(CURDIR) python3 -m training.gpu_check $(ARGS)
