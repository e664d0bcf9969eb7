# `make serve` installs what plugd needs and serves; `make test` installs the test set and runs every test.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
PYPROJECTS := pyproject.toml $(wildcard */*/pyproject.toml)
# Debian packages: OpenBLAS, which runners preload on Linux CPUs for fast float32 GEMM; for the tests also
# docker-registry, the OCI registry the pull/push tests and bench/pull.py start on loopback, and curl, the
# peer bench/pull.py measures against.
DEBIAN_PACKAGES := libopenblas0-pthread
DEBIAN_TEST_PACKAGES := $(DEBIAN_PACKAGES) docker-registry curl
# apt-get install, through sudo when not root; the packages follow it.
APT_INSTALL = SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq

# The coding agents the end-to-end tests drive (Claude Code, Codex CLI), from npm at the versions pinned there.
CLIENTS := tests/clients

.PHONY: serve test system-packages system-test-packages
serve: system-packages $(VENV)/.installed
	$(BIN)/plugd serve

test: system-test-packages $(VENV)/.installed-test $(CLIENTS)/node_modules/.installed
	$(BIN)/python -m pytest $(PYTEST_ARGS)

system-test-packages: DEBIAN_PACKAGES := $(DEBIAN_TEST_PACKAGES)
system-test-packages: system-packages

system-packages:
	@if command -v apt-get >/dev/null && ! dpkg -s $(DEBIAN_PACKAGES) >/dev/null 2>&1; then \
		$(APT_INSTALL) $(DEBIAN_PACKAGES); \
	fi

# Debian's python3.X leaves venv's ensurepip to the package python3.X-venv (python3-venv depends on the default one).
$(BIN)/python:
	@if command -v apt-get >/dev/null && ! $(PYTHON) -c "import ensurepip, venv" >/dev/null 2>&1; then \
		$(APT_INSTALL) python$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv; \
	fi
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python requirements.txt $(PYPROJECTS)
	$(BIN)/pip install -q -r requirements.txt
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements-test.txt
	$(BIN)/pip install -q -r requirements-test.txt
	touch $@

# Node.js and npm from Debian where the machine has no npm.
$(CLIENTS)/node_modules/.installed: $(CLIENTS)/package.json $(CLIENTS)/package-lock.json
	@if ! command -v npm >/dev/null && command -v apt-get >/dev/null; then $(APT_INSTALL) nodejs npm; fi
	npm ci --prefix $(CLIENTS) --no-audit --no-fund --loglevel=error
	touch $@
