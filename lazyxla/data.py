"""Deprecated alias: ``lazyxla.data`` is ``lazyxla.parallel.data`` (kept for one release; warns once).

Use lazyxla.DeviceLoader (lazyxla.parallel.data).

Example::

    import lazyxla.parallel.data
"""

from lazyxla.parallel import data as _module
from lazyxla.util import moved_module

moved_module(__name__, _module, "lazyxla.DeviceLoader (lazyxla.parallel.data)")
