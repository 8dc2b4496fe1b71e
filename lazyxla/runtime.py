"""``lazyxla.runtime``: the run's processes and replicas (see ``lazyxla.device.processes``).

Example::

    import lazyxla
    if lazyxla.runtime.is_master():
        print("replicas:", lazyxla.runtime.world_size())
"""

from lazyxla.device.processes import (
    DistributedError,
    global_ordinal,
    initialize,
    is_master,
    local_ordinal,
    mesh_reduce,
    process_count,
    process_index,
    rendezvous,
    world_size,
)

__all__ = [
    "DistributedError",
    "global_ordinal",
    "initialize",
    "is_master",
    "local_ordinal",
    "mesh_reduce",
    "process_count",
    "process_index",
    "rendezvous",
    "world_size",
]
