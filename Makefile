# Two commands on a fresh machine: `make demo` and `make test`. Both set up .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-ops lint bench clean

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

bench: $(STAMP)
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) .pytest_cache
