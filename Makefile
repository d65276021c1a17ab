# The README's two commands, `make run` and `make test`, each install what they need first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# `make run` installs the package and what it needs to train; `make test` adds the test extra
# (Ray, RLlib, rlax, TensorBoard, W&B, ALE, ...) to the same venv.
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed
# The package's bytecode, written even under PYTHONDONTWRITEBYTECODE=1 so that no launch
# compiles the modules from source; only stale files are rewritten.
BYTECODE := $(BIN)/python -m compileall -q impala_jax benchmarks experiments
# The CUDA build of jaxlib only where a GPU driver is present.
comma := ,
GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo cuda12)
EXTRAS := test$(if $(GPU),$(comma)$(GPU))
RUN_EXTRAS := $(if $(GPU),[$(GPU)])

.PHONY: install run notebook test test-slow test-long bench bench-minatar bench-pbt soak lint format clean

install: $(STAMP)

$(RUN_STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".$(RUN_EXTRAS)"
	$(BYTECODE)
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	$(BYTECODE)
	touch $(STAMP)

run: $(RUN_STAMP)
	$(BIN)/python -m impala_jax.run experiments/cartpole.py

# JupyterLab on notebooks/ (the notebooks extra); sweep_analysis.ipynb also needs the tune extra.
NOTEBOOK_STAMP := $(VENV)/.installed-notebooks
$(NOTEBOOK_STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install --quiet -e ".[notebooks$(if $(GPU),$(comma)$(GPU))]"
	touch $(NOTEBOOK_STAMP)

notebook: $(NOTEBOOK_STAMP)
	$(BIN)/jupyter lab notebooks

test: install
	$(BIN)/python -m pytest -q -m "not slow" --durations=15

# The tests `make test` leaves out: learning runs, Tune and Ray clusters, two-process runs; all
# but the learning runs of a minute or more (`long`), which `make test-long` runs.
test-slow: install
	$(BIN)/python -m pytest -q -m "slow and not long" --durations=15

test-long: install
	$(BIN)/python -m pytest -q -m long --durations=15

bench: install
	$(BYTECODE)
	$(BIN)/python -m benchmarks.run_all

# The MinAtar table (benchmarks/minatar.py): 4 games x 3 seeds x 10 M env steps of IMPALA and
# of PPO with PureJaxRL's settings, about an hour on 2 cores; not in bench.
bench-minatar: install
	$(BIN)/python -m benchmarks.minatar

# Population-based training in one program (benchmarks/pbt.py): Breakout-MinAtar PBT against
# exploit off (3 seeds each), the population's speed, the same PBT through Ray Tune; about 45
# minutes on 2 cores; not in bench.
bench-pbt: install
	$(BIN)/python -m benchmarks.pbt

# 20 minutes of CartPole under runner kills and NaN batches (benchmarks/soak.py); not in bench.
soak: install
	$(BIN)/python -m benchmarks.soak

lint: install
	$(BIN)/ruff check impala_jax tests experiments benchmarks
	$(BIN)/ruff format --check impala_jax tests experiments benchmarks

format: install
	$(BIN)/ruff check --fix impala_jax tests experiments benchmarks
	$(BIN)/ruff format impala_jax tests experiments benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
