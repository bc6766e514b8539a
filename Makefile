# Two entry points, each self-contained on a fresh machine (Python >= 3.10 with venv):
#   make demo       -> creates .venv, installs andrea_jax, trains the tiny model on the built-in corpus
#   make test       -> creates .venv, installs andrea_jax[test], runs the whole test suite
#   make test-fast  -> the same without the tests marked slow (those that train or start a process)
# Everything else (bench, notebooks, lint) is optional.

PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
# The GPT-2 conversion test compares against Hugging Face transformers, which needs torch.
# 2.13.0 has a CPU wheel in CI's wheelhouse; override (e.g. TORCH=torch) to take another build.
TORCH  ?= torch==2.13.0
WORKDIR ?= runs/tiny
CONFIG  ?= experiments/tiny.py
ARGS    ?=
# Test processes (pytest-xdist; each test file runs whole in one of them): the suite is mostly
# single-threaded compilation, so two workers use both of CI's two cores. 0 runs it in one process.
WORKERS ?= 2

.PHONY: demo test test-fast bench notebooks clean gpu-wheels

# The prepared GPU check (bench/device_check.py) runs on a machine with no network whose image has
# Python 3.12, jax, flax, optax, orbax, torch and most of our needs, but not these: their wheels go
# into .whl/ beside the repository (ignored by git), and the check installs them with --no-deps.
# .whl/build/ holds what pip needs to build andrea_jax itself there (pyproject.toml's build-system).
GPU_PYTHON  ?= 3.12
GPU_WHEELS  ?= ml-collections==1.1.0 tensorboardX==2.6.5
GPU_BUILD   ?= setuptools==84.2.1 wheel==0.46.3 packaging==26.4
GPU_PLATFORMS = $(foreach n,manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
                  manylinux2014_x86_64 manylinux1_x86_64,--platform $(n))

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e .
	touch $@

$(VENV)/.test: $(VENV)/.base
	$(PIP) install -q "$(TORCH)" -e ".[test]"
	touch $@

demo: $(VENV)/.base
	$(PY) -m andrea_jax.main --config=$(CONFIG) --workdir=$(WORKDIR) $(ARGS)

test: $(VENV)/.test
	$(PY) -m pytest -q -n $(WORKERS) --dist loadfile $(ARGS)

test-fast: $(VENV)/.test
	$(PY) -m pytest -q -n $(WORKERS) --dist loadfile -m "not slow" $(ARGS)

bench: $(VENV)/.test
	$(PIP) install -q -e ".[bench]"
	for b in model train data simplex curriculum target_gain terrain ablation v1_vs_v2 faults; do $(PY) -m bench.$$b || exit 1; done

notebooks: $(VENV)/.test
	$(PIP) install -q -e ".[notebooks]"
	$(VENV)/bin/jupyter lab notebooks/

gpu-wheels:
	rm -rf .whl && mkdir -p .whl/build
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version $(GPU_PYTHON) \
	  --implementation cp $(GPU_PLATFORMS) -d .whl $(GPU_WHEELS)
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version $(GPU_PYTHON) \
	  --implementation cp $(GPU_PLATFORMS) -d .whl/build $(GPU_BUILD)
	ls .whl .whl/build

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
