# Two entry points: `make demo` and `make test`. Both build the virtual environment first, from the
# repository's own files only. torch is taken from the wheels on this machine's disk (never a newer one).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PYTHON ?= python3
DEMO_DIR ?= artifacts/demo

.PHONY: install demo test lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.14.1 torchvision==0.29.1
	$(PIP) install --quiet -c constraints.txt -e '.[dev]'
	touch $@

# The model pipeline end to end on a small synthetic catalogue: generate, train briefly, evaluate.
demo: install
	$(VENV)/bin/ccrk data synth --out $(DEMO_DIR)/data --n-train 2000 --n-val 100 --n-test 1000
	$(VENV)/bin/ccrk train --preset demo --data $(DEMO_DIR)/data --output $(DEMO_DIR)/run --epochs 4 --batch-size 32
	$(VENV)/bin/ccrk eval --model $(DEMO_DIR)/run/model --data $(DEMO_DIR)/data --json-out $(DEMO_DIR)/eval.json

test: install
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) artifacts .pytest_cache .ruff_cache
