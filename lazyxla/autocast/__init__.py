"""Deprecated alias: ``lazyxla.autocast`` is ``lazyxla.frontend.autocast`` (kept for one release; warns once).

Use lazyxla.frontend.autocast.

Example::

    import lazyxla.frontend.autocast
"""

import sys

from lazyxla.frontend import autocast as _module
from lazyxla.util import warn_once

warn_once(
    "moved:lazyxla.autocast",
    "lazyxla.autocast is deprecated: use lazyxla.frontend.autocast",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _module  # the module itself: every name, private ones included, as before the move
