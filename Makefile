# A newcomer needs two commands: `make serve` and `make test`. Each sets up .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test serve check fmt

install: $(STAMP)

# Re-run the set-up whenever the project's dependencies change.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

test: install
	$(PY) -m pytest -q

serve: install
	$(VENV)/bin/loomd serve

check: install
	$(VENV)/bin/loomc check samples

fmt: install
	$(VENV)/bin/loomc fmt samples loomc/motifs
