"""Device meshes and layouts: named arrangements of the run's devices, and layouts in canonical form.

A :class:`Mesh` (``lazyxla.spmd.Mesh``) is registered by its key when made, so that a recorded sharding
constraint (``torch.ops.lazyxla.shard``, whose arguments are the mesh's key and the spec as JSON) can be
lowered (``lowering/rules/collective.py``) and a buffer's layout mapped back to a mesh and a spec
(``lazyxla.spmd.get_sharding``). ``layouts`` gives the data leaves' layouts in canonical form, which key
SPMD programs in memory (``lazy/graph.py``) and on disk (``lowering/cache.py``).

Example::

    m = Mesh(range(8), (2, 4), ("data", "model"))
    assert lookup(m.key) is m
    layout = named_sharding(m.key, '["data", null]')     # what the lowering of ops.shard constrains to
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lazyxla import jax_private
from lazyxla.device.devices import global_devices
from lazyxla.ir import Leaf

_meshes: dict[str, Mesh] = {}  # Mesh.key -> Mesh, for the lowering of recorded constraints


class ShardingError(ValueError):
    """A sharding annotation that does not fit the tensor or the mesh."""


class Mesh:
    """A logical mesh of devices: ``device_ids`` (global device indices) laid out as ``mesh_shape``, with
    one name per mesh axis.

    Example::

        n = lazyxla.spmd.device_count()
        mesh = lazyxla.spmd.Mesh(range(n), (2, n // 2), ("data", "model"))
    """

    def __init__(self, device_ids: Sequence[int], mesh_shape: Sequence[int], axis_names: Sequence[str]) -> None:
        ids = [int(i) for i in np.asarray(list(device_ids)).reshape(-1)]
        shape = tuple(int(s) for s in mesh_shape)
        names = tuple(str(a) for a in axis_names)
        devices = global_devices()
        if len(shape) != len(names):
            raise ShardingError(f"Mesh: {len(shape)} mesh dimensions {shape} but {len(names)} axis names {names}")
        if len(set(names)) != len(names):
            raise ShardingError(f"Mesh: axis names must be distinct, got {names}")
        if math.prod(shape) != len(ids):
            raise ShardingError(f"Mesh: shape {shape} holds {math.prod(shape)} devices, but {len(ids)} ids were given")
        if sorted(ids) != list(range(len(devices))):
            raise ShardingError(
                f"Mesh: device_ids must be each of the run's {len(devices)} devices (0..{len(devices) - 1}) once; "
                f"got {ids}"
            )
        self.device_ids, self.mesh_shape, self.axis_names = ids, shape, names
        self.jax_mesh = jax.sharding.Mesh(np.array([devices[i] for i in ids]).reshape(shape), names)
        self.key = json.dumps({"ids": ids, "shape": shape, "names": names})
        _meshes[self.key] = self  # what a recorded constraint (ops.shard) names it by

    @property
    def size(self) -> int:
        return len(self.device_ids)

    def axis_size(self, name: str) -> int:
        return self.mesh_shape[self.axis_names.index(name)]

    def sharding(self, spec: Sequence) -> NamedSharding:
        """The jax ``NamedSharding`` of ``spec`` on this mesh."""
        return NamedSharding(self.jax_mesh, P(*spec))

    def __repr__(self) -> str:
        return f"Mesh(shape={self.mesh_shape}, axis_names={self.axis_names})"


def is_known(jax_mesh) -> bool:
    """Whether ``jax_mesh`` is the jax mesh of a :class:`Mesh` built here."""
    return any(m.jax_mesh == jax_mesh for m in _meshes.values())


def lookup(key: str) -> Mesh:
    """The mesh made with ``key`` (``Mesh.key``) in this process."""
    return _meshes[key]


def decode_spec(text: str) -> tuple:
    """A partition spec from its JSON form (lists of axis names back to tuples)."""
    return tuple(tuple(e) if isinstance(e, list) else e for e in json.loads(text))


def named_sharding(key: str, spec: str) -> NamedSharding:
    """The layout a recorded constraint ``shard(x, key, spec)`` names (mesh key, JSON spec)."""
    return lookup(key).sharding(decode_spec(spec))


def spec_of_layout(sharding, ndim: int) -> tuple[Mesh | None, tuple] | None:
    """A buffer's layout as (a mesh lazyxla knows, partition spec); None when replicated."""
    if sharding.is_fully_replicated:
        return None
    if isinstance(sharding, NamedSharding):
        for m in _meshes.values():
            if m.jax_mesh == sharding.mesh:
                return m, tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
    # a layout XLA chose (GSPMDSharding): find the spec it is equivalent to on a known mesh
    for m in _meshes.values():
        for spec in itertools.product((None, *m.axis_names), repeat=ndim):
            named = [a for a in spec if a is not None]
            if len(set(named)) == len(named) and sharding.is_equivalent_to(m.sharding(spec), ndim):
                return m, spec
    return None, (str(sharding),)


def layouts(leaves) -> tuple:
    """SPMD: the layouts of the data leaves (a program is compiled for its inputs' layouts), canonical:
    a step's outputs come back in layouts XLA chose (``GSPMDSharding``), equivalent to the ``NamedSharding``
    the same tensors had as inputs, and must key the same program."""
    return tuple(
        canonical_layout(n.payload.sharding, len(n.avals[0].shape))
        if n.op is Leaf.DATA and n.payload is not None
        else None
        for n in leaves
    )


_layout_keys: dict = {}


def canonical_layout(sharding, ndim: int):
    """A layout's canonical form, ``(HLO sharding text, device ids)``, memoized per sharding object."""
    key = (sharding, ndim)
    try:
        return _layout_keys[key]
    except KeyError:
        devices = tuple(d.id for d in jax_private.device_assignment(sharding))
        canon = _layout_keys[key] = (str(jax_private.hlo_sharding(sharding, ndim)), devices)
        return canon
