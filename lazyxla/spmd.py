"""``lazyxla.spmd``: device meshes and sharding annotations (see ``lazyxla.parallel.spmd``).

Example::

    import lazyxla
    lazyxla.spmd.enable()
    mesh = lazyxla.spmd.mesh((2, -1), ("data", "model"))
    lazyxla.spmd.mark_sharding(w, mesh, (None, "model"))
"""

from lazyxla.parallel.spmd import (
    Mesh,
    Shard,
    ShardingError,
    clear_sharding,
    device_count,
    enable,
    fsdp,
    get_global_mesh,
    get_sharding,
    hybrid_mesh,
    is_enabled,
    load_local_shards,
    local_shards,
    mark_sharding,
    mesh,
    replicated,
    set_global_mesh,
)

__all__ = [
    "Mesh",
    "Shard",
    "ShardingError",
    "clear_sharding",
    "device_count",
    "enable",
    "fsdp",
    "get_global_mesh",
    "get_sharding",
    "hybrid_mesh",
    "is_enabled",
    "load_local_shards",
    "local_shards",
    "mark_sharding",
    "mesh",
    "replicated",
    "set_global_mesh",
]
