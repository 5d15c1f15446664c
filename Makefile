# One command to set everything up and run the pipeline, one to set up and run the tests.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PROFILE ?= tiny

.PHONY: setup run powered test test-fast bench ui clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch==2.13.0 first: this machine keeps a CPU build of it on disk, while a loose range would pull
# a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[orchestration,triton,dev]'
	@if [ -x /usr/bin/chromium ]; then :; else \
	  echo "installing Debian chromium for the UI browser test"; \
	  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "chromium could not be installed: the browser test will be skipped"; \
	fi
	@# envs/jail.py runs every model-written command in a bubblewrap sandbox and refuses to run without one.
	@if [ -x /usr/bin/bwrap ]; then :; else \
	  echo "installing Debian bubblewrap for the envs sandbox"; \
	  (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) || \
	  { echo "bubblewrap could not be installed: envs commands cannot run (install it: apt-get install -y bubblewrap)"; exit 1; }; \
	fi
	@bwrap --unshare-all --die-with-parent --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib \
	  --symlink usr/lib64 /lib64 /bin/true || { echo "bwrap cannot create namespaces here (unprivileged user \
	namespaces disabled?): envs commands will be refused rather than run unjailed"; exit 1; }
	@# kernels/native.py builds the CPU C kernels (SiTU-GLU, ShortConv) with the system C compiler;
	@# without one the torch paths run (slower, logged).
	@if command -v cc >/dev/null || command -v gcc >/dev/null; then :; else \
	  echo "installing Debian gcc for the CPU C kernels"; \
	  (apt-get update -qq && apt-get install -y -qq gcc >/dev/null) || echo "gcc could not be installed: the CPU kernels fall back to torch"; \
	fi
	touch $@

setup: $(VENV)/.installed

run: setup
	$(BIN)/k3 run --profile $(PROFILE)

# The powered post-training job, after `make run` (its home under .k3/): the nine RL cells at budgets
# that can show learning, then MOPD from them (most of a day on 2 cores, resumable; benchmarks/recipes/powered.py).
powered: setup
	PYTHONPATH=$(CURDIR) $(BIN)/python benchmarks/recipes/powered.py --mopd

test: setup
	$(BIN)/python -m pytest -n 2 --dist loadgroup

test-fast: setup
	$(BIN)/python -m pytest -n 2 --dist loadgroup -m "not slow and not e2e"

bench: setup
	$(BIN)/k3 bench kernels/kda_cpu
	$(BIN)/k3 bench model/train_step

ui: setup
	$(BIN)/k3 ui

clean:
	rm -rf .k3 build *.egg-info
