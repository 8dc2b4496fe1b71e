# Two commands on a fresh machine: `make demo` and `make test`. Both set up .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-ops test-upper lint bench bench-scan clean

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -c "import site, pathlib; pathlib.Path(site.getsitepackages()[0], 'lazyxla-dev.pth').write_text('$(CURDIR)\n')"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/train_mlp.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP) lint
	$(PY) -m pytest -q

# The whole OpInfo conformance suite (every op, every dtype; ~1 h on 2 cores), then the coverage summary.
test-ops: $(STAMP)
	$(PY) -m pytest -q tests/ops --opinfo=full; status=$$?; $(PY) -m lazyxla.tools.coverage; exit $$status

# The upper end of the torch range pyproject.toml declares (torch 2.14.1, a CUDA build of ~6 GB that pip finds
# on local disk): the same set-up with that torch, then the whole suite. docs/testing.md has its last result.
UPPER := .venv-upper
UPPER_TORCH := 2.14.1

$(UPPER)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(UPPER)
	sed 's/^torch==.*/torch==$(UPPER_TORCH)/' requirements.txt > $(UPPER)/requirements.txt
	$(UPPER)/bin/python -m pip install -q -r $(UPPER)/requirements.txt
	$(UPPER)/bin/python -c "import site, pathlib; pathlib.Path(site.getsitepackages()[0], 'lazyxla-dev.pth').write_text('$(CURDIR)\n')"
	touch $@

test-upper: $(UPPER)/.installed lint
	$(UPPER)/bin/python -c "import torch; assert torch.__version__.startswith('$(UPPER_TORCH)'), torch.__version__"
	$(UPPER)/bin/python -m pytest -q

bench: $(STAMP)
	$(PY) -m benchmarks.run

# Compile time against depth: a GPT's blocks under lazyxla.scan_layers / StackedLayers vs unrolled (docs/performance.md).
bench-scan: $(STAMP)
	$(PY) -m benchmarks.scan

clean:
	rm -rf $(VENV) $(UPPER) .pytest_cache
