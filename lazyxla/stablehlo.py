"""Deprecated alias: ``lazyxla.stablehlo`` is ``lazyxla.frontend.export`` (kept for one release; warns once).

Use lazyxla.export (lazyxla.frontend.export).

Example::

    import lazyxla.frontend.export
"""

from lazyxla.frontend import export as _module
from lazyxla.util import moved_module

moved_module(__name__, _module, "lazyxla.export (lazyxla.frontend.export)")
