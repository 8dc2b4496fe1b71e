import pytest

import lazyxla


@pytest.fixture
def dev():
    return lazyxla.device()


@pytest.fixture(autouse=True)
def _fresh_metrics():
    lazyxla.sync()
    lazyxla.metrics.reset()
    yield
