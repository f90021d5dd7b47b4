# steersman — two commands: `make up` runs the embedded default, `make test` runs the whole suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: up test venv bench-overhead bench-scheduler clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

up: $(STAMP)
	$(BIN)/steersman up

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench-overhead: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python bench/overhead/run.py --layout shared
	$(BIN)/python bench/overhead/run.py --layout isolated --out bench/overhead/results-isolated.json

bench-scheduler: $(STAMP)
	$(BIN)/python bench/scheduler/run.py

clean:
	rm -rf $(VENV) .pytest_cache
