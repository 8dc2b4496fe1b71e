"""Deprecated alias: ``lazyxla.regions`` is ``lazyxla.lazy.regions`` (kept for one release; warns once).

Use lazyxla.compile (lazyxla.lazy.regions).

Example::

    import lazyxla.lazy.regions
"""

from lazyxla.lazy import regions as _module
from lazyxla.util import moved_module

moved_module(__name__, _module, "lazyxla.compile (lazyxla.lazy.regions)")
