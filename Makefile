# Two commands on a fresh machine: `make demo` and `make test`. Both set up .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-ops test-upper test-pytorch census lint bench bench-hf bench-torch_xla-venv bench-scan clean

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
	$(PY) -m pytest -q --durations=25

# The whole OpInfo conformance suite (every op, every dtype; ~1 h on 2 cores), then the coverage summary.
test-ops: $(STAMP)
	$(PY) -m pytest -q tests/ops --opinfo=full; status=$$?; $(PY) -m lazyxla.tools.coverage; exit $$status

# PyTorch's own device-generic tests (../shared/pytorch-tests, or PYTORCH_TESTS=...) with a crash-isolating runner and
# their CPU twins; sampled to take about 1.5 hours on 2 cores (docs/testing.md). Their test files import
# hypothesis, installed beside the project (build/pytorch-tests-deps), not into the venv.
PTS_DEPS := build/pytorch-tests-deps

$(PTS_DEPS)/.installed: $(STAMP)
	$(PY) -m pip install -q --target $(PTS_DEPS) hypothesis==6.170.15
	touch $@

test-pytorch: $(STAMP) $(PTS_DEPS)/.installed
	PYTORCH_SUITE_PATH=$(CURDIR)/$(PTS_DEPS) nice -n 10 $(PY) -m lazyxla.tools.pytorch_suite --update-doc

# The fallback census over the whole model zoo (lazyxla/tools/census_zoo.py), its table written into docs/ops.md.
# timm is installed beside the project (build/census-deps), not into the venv, with the torchvision it imports
# (a CUDA build on PyPI, which census_zoo.py makes importable for timm: see _timm_module); ~15 minutes on 2 cores.
CENSUS_DEPS := build/census-deps

$(CENSUS_DEPS)/.installed: $(STAMP)
	$(PY) -m pip install -q --no-deps --target $(CENSUS_DEPS) timm==1.0.31 torchvision==0.28.0
	touch $@

census: $(STAMP) $(CENSUS_DEPS)/.installed
	PYTHONPATH=$(CURDIR)/$(CENSUS_DEPS) nice -n 10 $(PY) -m lazyxla.tools.fallback_census --markdown docs/ops.md

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

# HF GPT-2 / Llama training steps alone (also a section of `make bench`): lazyxla's modes, eager, and torch_xla when
# the optional venv below exists.
bench-hf: $(STAMP)
	$(PY) -m benchmarks.hf

# Optional: torch_xla 2.9 (with the torch 2.9.0 it is built against, a CUDA build of ~7 GB from PyPI, run on the CPU
# with PJRT_DEVICE=CPU) in a venv of its own, a peer the benchmarks measure side by side; never a dependency of the
# project. benchmarks/hf.py finds it here, or at $$TORCH_XLA_PEER_VENV.
TORCH_XLA_VENV := .venv-torch_xla
TRANSFORMERS := $(shell sed -n 's/^transformers==\([^ ]*\).*/\1/p' requirements.txt)

$(TORCH_XLA_VENV)/.installed:
	$(PYTHON) -m venv $(TORCH_XLA_VENV)
	$(TORCH_XLA_VENV)/bin/python -m pip install -q torch==2.9.0 torch_xla==2.9.0 transformers==$(TRANSFORMERS)
	PJRT_DEVICE=CPU $(TORCH_XLA_VENV)/bin/python -c "import torch, torch_xla; torch.ones(2, device=torch_xla.device()).sum().item()"
	touch $@

bench-torch_xla-venv: $(TORCH_XLA_VENV)/.installed

# Compile time against depth: a GPT's blocks under lazyxla.scan_layers / StackedLayers vs unrolled (docs/performance.md).
bench-scan: $(STAMP)
	$(PY) -m benchmarks.scan

clean:
	rm -rf $(VENV) $(UPPER) $(TORCH_XLA_VENV) .pytest_cache
