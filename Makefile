# Two entry points: `make demo` and `make test`. Both build the virtual environment first, from the
# repository's own files only. torch is taken from the wheels on this machine's disk (never a newer one).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PYTHON ?= python3
DEMO_DIR ?= artifacts/demo
DEMO_ITEMS ?= 1000
INDEX_ROOT ?= artifacts/indexes
DEMO_HOST ?= 127.0.0.1
DEMO_PORT ?= 8000
DEFAULT_MODEL := model/pretrained/ccrk-demo
# The demo service: the demo index, its probe set (the dashboard's consistency history starts at startup).
SERVE := CCRK_PROBE_SET=$(DEMO_DIR)/probes.jsonl $(VENV)/bin/ccrk serve --host $(DEMO_HOST) --port $(DEMO_PORT) \
	--index-root $(INDEX_ROOT) --index-name demo

STARTER_MODEL ?= artifacts/models/ccrk-starter
PHOTOS ?=
# A make value as one shell word (single quotes; a quote inside written '\''): folder names with spaces.
shell_word = '$(subst ','\'',$(1))'

.PHONY: install demo demo-index demo-eval serve photos train-demo test lint docs docs-serve gpu-check clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.14.1 torchvision==0.29.1
	$(PIP) install --quiet -c constraints.txt -e '.[dev,ray,docs]'
	touch $@

# The demo: the embedded default model searching 1,000 freshly drawn products (captions in ten languages),
# served on http://127.0.0.1:8000 (search page /, dashboard /dashboard, API /docs) until Ctrl-C.
demo: demo-index
	$(SERVE)

# The demo catalogue, its probe set and index, built once: an existing index is kept (`make clean`, or
# `rm -r artifacts/indexes/demo`, to draw and build again).
demo-index: $(INDEX_ROOT)/demo/CURRENT

$(INDEX_ROOT)/demo/CURRENT: | install
	$(VENV)/bin/ccrk data synth --out $(DEMO_DIR)/data --n-train 0 --n-val 0 --n-test $(DEMO_ITEMS) --shop-titles de
	$(VENV)/bin/ccrk probe make-set --catalogue $(DEMO_DIR)/data/test.jsonl --out $(DEMO_DIR)/probes.jsonl --n 100
	$(VENV)/bin/ccrk index build --name demo --index-root $(INDEX_ROOT) --text-fields title $(DEMO_DIR)/data/test.jsonl

# The demo service again, on the index built by `make demo-index`.
serve: demo-index
	$(SERVE)

# The embedded default model's per-language Recall@1/5/10 and MRV on the demo catalogue (no service).
demo-eval: demo-index
	$(VENV)/bin/ccrk eval --model $(DEFAULT_MODEL) --data $(DEMO_DIR)/data --backend onnx --json-out $(DEMO_DIR)/eval.json

# Your own photos: the starter model (built once from installed packages), the folder indexed as `photos`
# (a new version on each run; unchanged files are encoded again), served on http://127.0.0.1:8000.
photos: install
	@test -n $(call shell_word,$(PHOTOS)) || { echo "usage: make photos PHOTOS=path/to/a/folder/of/photos"; exit 2; }
	test -f $(call shell_word,$(STARTER_MODEL))/config.json || \
		$(VENV)/bin/ccrk model build-starter --out $(call shell_word,$(STARTER_MODEL))
	$(VENV)/bin/ccrk index build --name photos --index-root $(call shell_word,$(INDEX_ROOT)) \
		--model $(call shell_word,$(STARTER_MODEL)) $(call shell_word,$(PHOTOS))
	$(VENV)/bin/ccrk serve --host $(DEMO_HOST) --port $(DEMO_PORT) --index-root $(call shell_word,$(INDEX_ROOT)) \
		--index-name photos --model $(call shell_word,$(STARTER_MODEL))

# Reproduces the shipped default model from scratch (seeded; about 45 minutes on 2 cores).
train-demo: install
	$(VENV)/bin/ccrk data synth --out data/synth --seed 0
	$(VENV)/bin/ccrk train --preset demo --data data/synth --output runs/demo-kcl --epochs 8 --batch-size 64 --lr 1e-3 --seed 0
	$(VENV)/bin/ccrk export onnx --model runs/demo-kcl/model

# The suite on TEST_WORKERS pytest-xdist workers (tests/conftest.py says how they share the machine).
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS)

lint: install
	$(VENV)/bin/ruff check .

# The documentation site (mkdocs-material, docs/ and mkdocs.yml): built into site/, strictly (a broken link or
# anchor fails); the CLI, settings and HTTP API pages are generated from the code at each build.
DOCS_PORT ?= 8001
docs: install
	$(VENV)/bin/mkdocs build --strict

# The same, served on http://127.0.0.1:$(DOCS_PORT) and rebuilt on every change until Ctrl-C.
docs-serve: install
	$(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:$(DOCS_PORT)

# Every GPU path checked on a machine with a CUDA GPU (bench/gpu_check.py: faiss-gpu against the CPU index, the
# ONNX CUDA provider against the CPU one for the default and the starter models, 50 steps of CUDA training and a
# resume, the index and search benchmarks in short modes), in about 8 minutes, ending with one summary line; the figures go to
# bench/results/gpu-check-<date>.json. The GPU stack goes into its own virtual environment, GPU_VENV
# (.venv-gpu), never into the CPU .venv that `make test` and CI use: there it installs the project as
# `make install` does, uninstalls every faiss and onnxruntime build (two builds of one module must never be
# installed together: each one's files are the other's), then installs one GPU extra of pyproject.toml,
# GPU_EXTRA: auto (deploy/gpu_extra.py: gpu-cuvs, CUDA 13, for nvidia-smi's driver 580 or newer, which also
# matches make install's CUDA 13 torch; gpu, CUDA 12, for 525.60 to 579), gpu or gpu-cuvs.
# GPU_CHECK_PYTHON=python3 runs it with an interpreter that already has the project's packages and the GPU
# builds (a GPU image), installing nothing. No GPU: exit 2 at once.
GPU_CHECK_PYTHON ?=
GPU_VENV ?= .venv-gpu
GPU_EXTRA ?= auto
GPU_PY := $(GPU_VENV)/bin/python
GPU_PIP := $(GPU_VENV)/bin/pip
FAISS_AND_ORT := faiss-cpu faiss-gpu faiss-gpu-cu12 faiss-gpu-cuvs onnxruntime onnxruntime-gpu
gpu-check:
	@nvidia-smi -L >/dev/null 2>&1 || { echo "gpu-check: FAILED: no CUDA GPU on this machine (nvidia-smi is missing or lists no GPU); nothing was checked" >&2; exit 2; }
ifeq ($(GPU_CHECK_PYTHON),)
	$(MAKE) install VENV=$(GPU_VENV)
	$(GPU_PIP) uninstall --quiet --yes $(FAISS_AND_ORT)
	$(GPU_PY) deploy/gpu_extra.py $(GPU_EXTRA) > $(GPU_VENV)/gpu-extra.txt
	$(GPU_PIP) install --quiet -c constraints.txt -r $(GPU_VENV)/gpu-extra.txt
	$(GPU_PY) bench/gpu_check.py $(GPU_CHECK_ARGS)
else
	$(GPU_CHECK_PYTHON) bench/gpu_check.py $(GPU_CHECK_ARGS)
endif

clean:
	rm -rf $(VENV) $(GPU_VENV) artifacts site .pytest_cache .ruff_cache
