"""Deprecated alias: ``lazyxla.collectives`` is ``lazyxla.parallel.collectives`` (kept for one release; warns once).

Use lazyxla's own names (lazyxla.all_reduce, ...; lazyxla.parallel.collectives).

Example::

    import lazyxla.parallel.collectives
"""

import sys

from lazyxla.parallel import collectives as _module
from lazyxla.util import warn_once

warn_once(
    "moved:lazyxla.collectives",
    "lazyxla.collectives is deprecated: use lazyxla.all_reduce & co. (lazyxla.parallel.collectives)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _module  # the module itself: every name, private ones included, as before the move
