"""Deprecated alias: ``lazyxla.device.runtime`` is ``lazyxla.device.devices`` (kept for one release; warns once).

Use lazyxla.device.devices.

Example::

    import lazyxla.device.devices
"""

from lazyxla.device import devices as _module
from lazyxla.util import moved_module

moved_module(__name__, _module, "lazyxla.device.devices")
