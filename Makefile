# Two commands do everything on a fresh machine: `make demo` and `make test`.
#
#   make test       CI (.ci/run): ruff, then every test, the slow ones included.
#   make test-fast  while developing: ruff, then every test not marked slow (pytest -m "not slow":
#                   no subprocess, DDP, Flower deployment, example or screenshot run), under two
#                   minutes on 2 cores. The `slow` marker is registered in pyproject.toml.
#   make bench      the benchmarks' default runs through the runner (python -m benchmarks NAME
#                   [args]; python -m benchmarks lists them), each writing benchmarks/results/.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo examples test test-fast lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# CPU build of torch first: plain `torch` would pull several GB of CUDA packages.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test,flower,loggers]"
	touch $(STAMP)

demo: $(STAMP)
	PYTHONPATH=. $(PY) examples/federated_canary_audit.py

examples: $(STAMP)
	PYTHONPATH=. $(PY) examples/federated_canary_audit.py
	PYTHONPATH=. $(PY) examples/dpsgd_label_audit.py
	PYTHONPATH=. $(PY) examples/ldp_audit.py
	PYTHONPATH=. $(PY) examples/srr_vs_two_point.py
	PYTHONPATH=. $(PY) examples/flower_canary_audit.py

lint: $(STAMP)
	$(PY) -m ruff check .

test: $(STAMP)
	$(PY) -m ruff check .
	PYTHONPATH=. $(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m ruff check .
	PYTHONPATH=. $(PY) -m pytest -q -m "not slow"

bench: $(STAMP)
	PYTHONPATH=. $(PY) -m benchmarks gaussian_one_shot
	PYTHONPATH=. $(PY) -m benchmarks canary_overhead
	PYTHONPATH=. $(PY) -m benchmarks label_audit_overhead
	PYTHONPATH=. $(PY) -m benchmarks ldp_trials

clean:
	rm -rf $(VENV) lightning_logs .pytest_cache
