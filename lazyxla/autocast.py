"""Deprecated alias: ``lazyxla.autocast`` is ``lazyxla.frontend.autocast`` (kept for one release; warns once).

Use lazyxla.frontend.autocast.

Example::

    import lazyxla.frontend.autocast
"""

from lazyxla.frontend import autocast as _module
from lazyxla.util import moved_module

moved_module(__name__, _module, "lazyxla.frontend.autocast")
