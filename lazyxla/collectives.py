"""Deprecated alias: ``lazyxla.collectives`` is ``lazyxla.parallel.collectives`` (kept for one release; warns once).

Use lazyxla's own names (lazyxla.all_reduce, ...; lazyxla.parallel.collectives).

Example::

    import lazyxla.parallel.collectives
"""

from lazyxla.parallel import collectives as _module
from lazyxla.util import moved_module

moved_module(__name__, _module, "lazyxla.all_reduce & co. (lazyxla.parallel.collectives)")
