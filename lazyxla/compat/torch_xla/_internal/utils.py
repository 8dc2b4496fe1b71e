"""``torch_xla._internal.utils``: parsing torch_xla's hardware device names (``'TPU:0'``, ``'CPU:1'``).

Example::

    from torch_xla._internal import utils
    assert utils.parse_xla_device("CPU:1") == ("CPU", 1)
"""

from __future__ import annotations

import re

from lazyxla.compat._common import missing_attribute


def parse_xla_device(device: str) -> tuple[str, int] | None:
    """``'TPU:3'`` -> ``('TPU', 3)``; None for anything else (lower case, no index), as torch_xla.

    Example::

        kind, index = parse_xla_device(torch_xla.real_devices()[0])
    """
    m = re.match(r"([A-Z]+):(\d+)$", device)
    return (m.group(1), int(m.group(2))) if m else None


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
