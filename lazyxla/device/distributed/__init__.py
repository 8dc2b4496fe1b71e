"""Deprecated alias: ``lazyxla.device.distributed`` is ``lazyxla.device.processes`` (kept for one release; warns once).

Use lazyxla.runtime (lazyxla.device.processes).

Example::

    import lazyxla.device.processes
"""

import sys

from lazyxla.device import processes as _module
from lazyxla.util import warn_once

warn_once(
    "moved:lazyxla.device.distributed",
    "lazyxla.device.distributed is deprecated: use lazyxla.runtime (lazyxla.device.processes)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _module  # the module itself: every name, private ones included, as before the move
