# steersman — two commands: `make up` runs the embedded default, `make test` runs the whole suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: up test venv llama up-llama bench-overhead bench-scheduler bench-peers bench-twin bench-policies bench-faults clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

up: $(STAMP)
	$(BIN)/steersman up

# llama-server + Gemma 3 270M GGUF for the real-engine tests, cached outside the repo (~15 min once per machine)
llama: $(STAMP)
	PYTHON=$(BIN)/python nice -n 10 scripts/build-llama-server.sh

up-llama: llama
	$(BIN)/steersman up --engines llamacpp:2

test: $(STAMP) llama
	$(BIN)/python -m pytest -q

bench-overhead: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python bench/overhead/run.py --layout shared
	$(BIN)/python bench/overhead/run.py --layout isolated --out bench/overhead/results-isolated.json

bench-scheduler: $(STAMP)
	$(BIN)/python bench/scheduler/run.py

bench-faults: $(STAMP)   # live fault drills (overload, cascade); one: bench/faults/run.py overload
	$(BIN)/python bench/faults/run.py

bench-policies: $(STAMP)
	$(BIN)/python bench/policies/run.py

bench-twin: $(STAMP)   # 1,000,000 requests over 1,000 simulated GPUs; quicker: bench/twin/run.py --requests N --gpus G
	$(BIN)/python bench/twin/run.py

bench-peers: $(STAMP) llama
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	bench/setup_peers.sh
	$(BIN)/python bench/peers/run.py

clean:
	rm -rf $(VENV) .pytest_cache
