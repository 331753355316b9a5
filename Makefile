# Two entry points: `make demo` and `make test`. Both build the virtual environment first, from the
# repository's own files only. torch is taken from the wheels on this machine's disk (never a newer one).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PYTHON ?= python3
DEMO_DIR ?= artifacts/demo
DEFAULT_MODEL := model/pretrained/ccrk-demo

.PHONY: install demo train-demo test lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.14.1 torchvision==0.29.1
	$(PIP) install --quiet -c constraints.txt -e '.[dev]'
	touch $@

# The embedded default model on 1,000 freshly generated test products in ten languages (about a minute).
demo: install
	$(VENV)/bin/ccrk data synth --out $(DEMO_DIR)/data --n-train 0 --n-val 0 --n-test 1000
	$(VENV)/bin/ccrk eval --model $(DEFAULT_MODEL) --data $(DEMO_DIR)/data --backend onnx --json-out $(DEMO_DIR)/eval.json

# Reproduces the shipped default model from scratch (seeded; about 45 minutes on 2 cores).
train-demo: install
	$(VENV)/bin/ccrk data synth --out data/synth --seed 0
	$(VENV)/bin/ccrk train --preset demo --data data/synth --output runs/demo-kcl --epochs 8 --batch-size 64 --lr 1e-3 --seed 0
	$(VENV)/bin/ccrk export onnx --model runs/demo-kcl/model

test: install
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) artifacts .pytest_cache .ruff_cache
