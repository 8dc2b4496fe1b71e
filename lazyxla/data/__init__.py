"""Deprecated alias: ``lazyxla.data`` is ``lazyxla.parallel.data`` (kept for one release; warns once).

Use lazyxla.DeviceLoader (lazyxla.parallel.data).

Example::

    import lazyxla.parallel.data
"""

import sys

from lazyxla.parallel import data as _module
from lazyxla.util import warn_once

warn_once(
    "moved:lazyxla.data",
    "lazyxla.data is deprecated: use lazyxla.DeviceLoader (lazyxla.parallel.data)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _module  # the module itself: every name, private ones included, as before the move
