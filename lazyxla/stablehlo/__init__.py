"""Deprecated alias: ``lazyxla.stablehlo`` is ``lazyxla.frontend.export`` (kept for one release; warns once).

Use lazyxla.export (lazyxla.frontend.export).

Example::

    import lazyxla.frontend.export
"""

import sys

from lazyxla.frontend import export as _module
from lazyxla.util import warn_once

warn_once(
    "moved:lazyxla.stablehlo",
    "lazyxla.stablehlo is deprecated: use lazyxla.export (lazyxla.frontend.export)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _module  # the module itself: every name, private ones included, as before the move
