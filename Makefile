# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo examples test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# CPU build of torch first: plain `torch` would pull several GB of CUDA packages.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test,flower]"
	touch $(STAMP)

demo: $(STAMP)
	PYTHONPATH=. $(PY) examples/federated_canary_audit.py

examples: $(STAMP)
	PYTHONPATH=. $(PY) examples/federated_canary_audit.py
	PYTHONPATH=. $(PY) examples/dpsgd_label_audit.py
	PYTHONPATH=. $(PY) examples/ldp_audit.py
	PYTHONPATH=. $(PY) examples/srr_vs_two_point.py

lint: $(STAMP)
	$(PY) -m ruff check .

test: $(STAMP)
	$(PY) -m ruff check .
	PYTHONPATH=. $(PY) -m pytest -q

bench: $(STAMP)
	PYTHONPATH=. $(PY) benchmarks/gaussian_one_shot.py
	PYTHONPATH=. $(PY) benchmarks/canary_overhead.py
	PYTHONPATH=. $(PY) benchmarks/label_audit_overhead.py
	PYTHONPATH=. $(PY) benchmarks/ldp_trials.py

clean:
	rm -rf $(VENV) lightning_logs .pytest_cache
