# Two commands on a fresh machine: `make demo` (set up + train snake locally) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
WEB_STAMP := web/node_modules/.installed
SYS_STAMP := $(VENV)/.system-deps
APT_PACKAGES := openssh-server rsync chromium iproute2 procps git-lfs slurmctld slurmd slurm-client munge fish tcsh \
	postgresql

.PHONY: demo test test-fast lint setup system-deps web-deps bench clean wheel

setup: $(STAMP)

# torch first, pinned to the CPU wheel (constraints.txt): an unpinned torch pulls GBs of CUDA packages.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,bench,local]'
	touch $@

# Debian packages the tests need: a real sshd, rsync (benchmark peer), chromium (browser tests),
# iproute2 (`ip`: the network namespaces of the multi-host tests), procps (pkill, in those tests) and
# g++ (torch.compile's CPU backend compiles C++: the --compile tests run it), and Slurm with munge (a
# real cluster for the `scheduler: slurm` tests, started by tests/slurm_cluster.py), fish and tcsh (login
# shells that are not sh: tests/test_login_shells.py), and PostgreSQL's server (its binaries only: the
# test starts a private cluster of its own, tests/test_optimize_postgres.py). The stamp follows
# this Makefile: a package added here is checked for on the next `make test`, not only on a fresh venv.
system-deps: $(SYS_STAMP)
$(SYS_STAMP): Makefile | $(STAMP)
	@missing=""; \
	[ -x /usr/sbin/sshd ] || missing="$$missing openssh-server"; \
	command -v rsync >/dev/null || missing="$$missing rsync"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	command -v pkill >/dev/null || missing="$$missing procps"; \
	command -v git-lfs >/dev/null || missing="$$missing git-lfs"; \
	command -v fish >/dev/null || missing="$$missing fish"; \
	command -v tcsh >/dev/null || missing="$$missing tcsh"; \
	command -v g++ >/dev/null || missing="$$missing g++"; \
	[ -x /usr/sbin/slurmctld ] || missing="$$missing slurmctld"; \
	[ -x /usr/sbin/slurmd ] || missing="$$missing slurmd"; \
	command -v sbatch >/dev/null || missing="$$missing slurm-client"; \
	[ -x /usr/sbin/munged ] || missing="$$missing munge"; \
	compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
	touch $@

web-deps: $(WEB_STAMP)
$(WEB_STAMP): $(wildcard web/package.json web/package-lock.json)
	@if [ -f web/package.json ]; then cd web && (npm ci --no-audit --no-fund || npm install --no-audit --no-fund); fi
	@mkdir -p web/node_modules && touch $@

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) tools/room_sizes.py --top 3

# The suite in three layers (docs/architecture.md, "Tests"): core (in-process, no sshd), ssh (real sshd
# hosts), e2e (real training, several hosts, the browser, the wheel). `make test` runs them all on both
# cores, as CI does; `make test-fast` runs core alone, the loop for an edit. PYTEST_ARGS adds options
# (`PYTEST_ARGS='-k fetch'`), TEST_WORKERS the number of pytest-xdist workers. Four on two cores: a test
# spends part of its time waiting (an ssh handshake, a poll, a process start), and two workers left the
# cores 18% idle; four keep them busy (BENCHMARKS.md, "The suite in layers").
TEST_WORKERS ?= 4
PYTEST_XDIST = -n $(TEST_WORKERS) --dist loadgroup
PYTEST_ARGS ?=
test: $(STAMP) system-deps web-deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest $(PYTEST_XDIST) --durations=15 $(PYTEST_ARGS)

test-fast: $(STAMP) system-deps web-deps
	$(VENV)/bin/pytest -m core $(PYTEST_XDIST) --durations=15 $(PYTEST_ARGS)

# The main job, on this machine (host `local`): train snake with the trainer's CPU preset, export,
# verify, place web/public/snake.onnx. DEMO_ARGS adds `--set KEY=VALUE` overrides.
DEMO_ARGS ?=
demo: $(STAMP) web-deps
	$(VENV)/bin/thrust-remote train snake --host local $(DEMO_ARGS)
	@echo "now watch it play: $(VENV)/bin/thrust-remote play"

# A wheel that carries the page `play` serves: tools/stage_web.py (standard library only, any python3)
# copies web/'s page and the three onnxruntime-web files it loads into thrust_remote/web-page/ (gitignored,
# pyproject's package-data), then `python -m build` runs from a throwaway venv that holds only `build`
# (it builds in an isolated env of its own, setuptools from the package index): no torch, no dev venv.
WHEEL_DIR ?= dist
BUILD_VENV ?= build/wheel-env
wheel: web-deps
	$(PYTHON) tools/stage_web.py
	rm -rf $(BUILD_VENV) && $(PYTHON) -m venv $(BUILD_VENV)
	$(BUILD_VENV)/bin/python -m pip install -q --disable-pip-version-check build
	$(BUILD_VENV)/bin/python -m build --outdir $(WHEEL_DIR) .
	rm -rf $(BUILD_VENV)

bench: $(STAMP) system-deps
	$(PY) bench/bench_train_overhead.py

clean:
	rm -rf $(VENV) web/node_modules .pytest_cache .ruff_cache thrust_remote/web-page dist build
