"""``torch_xla.utils.utils`` (``xu``) on lazyxla: the helpers training scripts use.

Example::

    import torch_xla.utils.utils as xu
    train_loader = xu.SampleGenerator(data=(torch.zeros(8, 1, 28, 28), torch.zeros(8, dtype=torch.int64)),
                                      sample_count=100)
"""

from __future__ import annotations

import os
from typing import Any

from lazyxla.compat._common import missing_attribute


class SampleGenerator:
    """Yields ``data`` ``sample_count`` times (a fake data loader).

    Example::

        loader = xu.SampleGenerator(data=(x, y), sample_count=10)
        assert len(loader) == 10
    """

    def __init__(self, data: Any, sample_count: int) -> None:
        self._data = data
        self._sample_count = sample_count
        self._count = 0

    def __iter__(self):
        return SampleGenerator(self._data, self._sample_count)

    def __len__(self) -> int:
        return self._sample_count

    def __next__(self):
        return self.next()

    def next(self):
        if self._count >= self._sample_count:
            raise StopIteration
        self._count += 1
        return self._data


def getenv_as(name: str, type: type, defval: Any = None) -> Any:  # noqa: A002  (torch_xla's parameter name)
    """The environment variable ``name`` converted to ``type`` (``bool`` understands 0/1/true/false), or
    ``defval`` when unset.

    Example::

        steps = xu.getenv_as("STEPS", int, 100)
    """
    value = os.environ.get(name)  # the user's own variable, by name: torch_xla's getenv_as
    if value is None:
        return defval
    if type is bool:
        return value.strip().lower() in ("1", "true", "yes", "on")
    return type(value)


def check_env_flag(name: str, default: str = "") -> bool:
    """Whether the environment variable ``name`` is set to a true value (1, on, yes, true).

    Example::

        if xu.check_env_flag("DEBUG"): ...
    """
    return os.getenv(name, default).upper() in ("ON", "1", "YES", "TRUE", "Y")


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
