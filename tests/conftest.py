import os

# In-process tests (and the processes they start) keep off the user's ~/.cache; test_persistent_cache.py
# turns the persistent cache on itself, with its own folders.
os.environ.setdefault("LAZYXLA_PERSISTENT_CACHE", "0")

import pytest

import lazyxla
import lazyxla.compat
from lazyxla.lazy import positions
from lazyxla.lowering.registry import RULES

# An op that has a lowering rule must never run on the CPU, unless a test says why it may
# (``@pytest.mark.allow_fallback("aten.index.Tensor")``: e.g. a boolean-mask read, whose shape
# depends on the data).
_RULED = {f"fallback.{op}" for op in RULES}


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "allow_fallback(*ops): ops with a rule that this test may run on the CPU (none given: any op)"
    )


@pytest.fixture
def dev():
    return lazyxla.device()


@pytest.fixture(autouse=True)
def _fresh_metrics_and_no_fallback_for_ruled_ops(request):
    lazyxla.sync()
    lazyxla.metrics.reset()
    positions.forget()  # which positions vary (lazy/positions.py) is learned per test, as in a fresh process
    yield
    markers = list(request.node.iter_markers("allow_fallback"))
    if any(not m.args for m in markers):  # allow_fallback() with no op: any op may fall back
        return
    allowed = {f"fallback.{op}" for m in markers for op in m.args}
    fell = sorted(k for k in lazyxla.metrics.counters() if k in _RULED - allowed)
    assert not fell, f"ops with a lowering rule ran on the CPU: {fell}"


def pytest_addoption(parser):
    parser.addoption(
        "--opinfo",
        default="fast",
        choices=("fast", "full"),
        help="OpInfo conformance: 'fast' (a representative subset, the default) or 'full' (every op)",
    )
    parser.addoption(
        "--opinfo-results",
        default=None,
        help="OpInfo conformance: where to write the per-case results (default build/opinfo-results.json)",
    )
    parser.addoption(
        "--opinfo-dtypes",
        default="all",
        help="OpInfo conformance: comma-separated dtype names to test (e.g. float32,int64,bool), or 'all'",
    )


@pytest.fixture
def torch_xla():
    """The torch_xla compatibility layer installed in this process (removed again afterwards)."""
    assert lazyxla.compat.install()
    import torch_xla

    yield torch_xla
    lazyxla.compat.uninstall()
