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
import weakref
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lazyxla import jax_private
from lazyxla.device.devices import global_devices
from lazyxla.ir import Leaf
from lazyxla.ops import ops
from lazyxla.util import Memo

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


def layout_key(n):
    """SPMD: data leaf ``n``'s layout as ``layouts`` keys it (None for a leaf without a buffer)."""
    return _layout_key(n) if n.op is Leaf.DATA and n.payload is not None else None


def layouts(leaves) -> tuple:
    """SPMD: the layouts of the data leaves (a program is compiled for its inputs' layouts), canonical:
    a step's outputs come back in layouts XLA chose (``GSPMDSharding``), equivalent to the ``NamedSharding``
    the same tensors had as inputs, and must key the same program. A leaf with an uneven layout (``asked``)
    adds it: the program constrains that input to it."""
    return tuple(_layout_key(n) if n.op is Leaf.DATA and n.payload is not None else None for n in leaves)


def _layout_key(n):
    canon = canonical_layout(n.payload.sharding, len(n.avals[0].shape))
    uneven = asked(n)
    return (canon, *uneven) if uneven else canon


# --- layouts that split a dimension unevenly ---------------------------------------------------------------------
# XLA (and torch_xla) take a layout whose mesh axes do not divide a dimension: the last parts are padded. jax keeps a
# buffer only in layouts that split every dimension evenly. So a tensor annotated that way keeps its buffer in the
# nearest even layout (those dimensions whole on each device: ``even_spec``) and its data leaf remembers the layout
# asked for (``ask``): programs constrain the tensor to it (XLA pads inside them, as torch_xla's runtime does), and
# lazyxla.spmd's queries (get_sharding, local_shards) report it.
_asked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # data leaf -> (mesh key, JSON spec)
_relaid: weakref.WeakSet = weakref.WeakSet()  # data leaves holding a buffer another leaf had, laid out anew


def parts(m: Mesh, spec: Sequence) -> list[int]:
    """How many parts each dimension is split into by the partition ``spec`` on mesh ``m``."""
    return [math.prod(m.axis_size(a) for a in _names(entry)) for entry in spec]


def _names(entry) -> tuple:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def even_spec(m: Mesh, spec: Sequence, shape: Sequence[int]) -> tuple:
    """``spec`` without the mesh axes of the dimensions of ``shape`` they do not divide evenly.

    Example::

        even_spec(Mesh(range(4), (4,), ("x",)), ("x", None), (63, 8))     # (None, None)
    """
    return tuple(None if n % k else e for e, n, k in zip(spec, shape, parts(m, spec)))


def even_sharding(key: str, spec: str, shape: Sequence[int]) -> NamedSharding:
    """The even layout a buffer of ``shape`` keeps for the layout ``named_sharding(key, spec)``."""
    m = lookup(key)
    return m.sharding(even_spec(m, decode_spec(spec), shape))


def ask(node, key: str, spec: str) -> None:
    """Remember that data leaf ``node`` is laid out as ``named_sharding(key, spec)``, which its buffer cannot be."""
    _asked[node] = (key, spec)


def relaid(node) -> None:
    """Remember that data leaf ``node`` holds another leaf's buffer laid out anew (``lazyxla.spmd.mark_sharding`` of
    computed data): device data made from device data without a program (whole-step capture refuses to take such
    a leaf made inside a step for a constant: ``lazy/capture.py``)."""
    _relaid.add(node)


def is_relaid(node) -> bool:
    """Whether data leaf ``node`` was made by laying out another one anew (``relaid``)."""
    return node in _relaid


def asked(node) -> tuple:
    """``(mesh key, JSON spec)`` of the uneven layout data leaf ``node`` stands for, or ``()``."""
    return _asked.get(node, ())


def uneven_constraint(node) -> tuple:
    """``(mesh key, JSON spec)`` when ``node`` is a sharding constraint (``ops.shard``) that splits a dimension
    unevenly (its result is kept as a buffer in the even layout, and remembers this one), else ``()``."""
    if node.op is not ops.shard.default:
        return ()
    _, key, spec = node.template[0]
    m, decoded = lookup(key), decode_spec(spec)
    return (key, spec) if even_spec(m, decoded, node.avals[0].shape) != decoded else ()


# (sharding, ndim) -> its canonical form: a few per mesh; shardings made anew each step would grow it forever, so the
# oldest leave past 4,096 (as lowering.cache's table of equivalent layouts)
_layout_keys = Memo("lazyxla.device.meshes._layout_keys", limit=4096)


def canonical_layout(sharding, ndim: int):
    """A layout's canonical form, ``(HLO sharding text, device ids)``, memoized per sharding object."""
    key = (sharding, ndim)
    try:
        return _layout_keys.table[key]
    except KeyError:
        devices = tuple(d.id for d in jax_private.device_assignment(sharding))
        return _layout_keys.remember(key, (str(jax_private.hlo_sharding(sharding, ndim)), devices))
