"""Deprecated alias: ``lazyxla.device.distributed`` is ``lazyxla.device.processes`` (kept for one release; warns once).

Use lazyxla.runtime (lazyxla.device.processes).

Example::

    import lazyxla.device.processes
"""

from lazyxla.device import processes as _module
from lazyxla.util import moved_module

moved_module(__name__, _module, "lazyxla.runtime (lazyxla.device.processes)")
