"""Deprecated alias: ``lazyxla.regions`` is ``lazyxla.lazy.regions`` (kept for one release; warns once).

Use lazyxla.compile (lazyxla.lazy.regions).

Example::

    import lazyxla.lazy.regions
"""

import sys

from lazyxla.lazy import regions as _module
from lazyxla.util import warn_once

warn_once(
    "moved:lazyxla.regions",
    "lazyxla.regions is deprecated: use lazyxla.compile (lazyxla.lazy.regions)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _module  # the module itself: every name, private ones included, as before the move
