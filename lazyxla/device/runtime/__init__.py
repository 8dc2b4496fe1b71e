"""Deprecated alias: ``lazyxla.device.runtime`` is ``lazyxla.device.devices`` (kept for one release; warns once).

Use lazyxla.device.devices.

Example::

    import lazyxla.device.devices
"""

import sys

from lazyxla.device import devices as _module
from lazyxla.util import warn_once

warn_once(
    "moved:lazyxla.device.runtime",
    "lazyxla.device.runtime is deprecated: use lazyxla.device.devices",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _module  # the module itself: every name, private ones included, as before the move
