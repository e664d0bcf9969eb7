# `make serve` installs what plugd needs and serves; `make test` installs the test set and runs every test.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
PYPROJECTS := pyproject.toml $(wildcard */*/pyproject.toml)

.PHONY: serve test
serve: $(VENV)/.installed
	$(BIN)/plugd serve

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest $(PYTEST_ARGS)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python requirements.txt $(PYPROJECTS)
	$(BIN)/pip install -q -r requirements.txt
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements-test.txt
	$(BIN)/pip install -q -r requirements-test.txt
	touch $@
