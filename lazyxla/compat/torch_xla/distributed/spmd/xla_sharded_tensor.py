"""``torch_xla.distributed.spmd.xla_sharded_tensor``: ``XLAShardedTensor`` and ``XLAShard``.

``XLAShardedTensor`` is torch_xla's view of a sharded device tensor as a ``DTensor``: it wraps the global tensor
(``global_tensor``), remembers the mesh shape and partition spec it was annotated with (``mesh_shape``,
``partition_spec``, indices into the mesh's axes) and offers the DTensor description of that layout
(``_spec``, ``placements``, cached until ``invalidate_spec_cache``), the parts each device holds
(``local_shards``, host copies) and a way to replace them (``load_local_shards_``). As in torch_xla, autograd
records on the wrapper and each op then runs on the global tensor, giving ``XLAShardedTensor`` results that know no
mesh (torch_xla's "auto-wrapped" tensors): ``XLAShardedTensor(t, requires_grad=True)`` gets a ``.grad``, and the
global tensors carry no autograd graph.

On lazyxla the layout lives on the tensor itself (``lazyxla.spmd``); the wrapper only carries what torch_xla's
wrapper carries for DTensor code and checkpointing.

Example::

    import torch_xla.distributed.spmd as xs
    w = xs.wrap_if_sharded(model.fc1.weight)          # an XLAShardedTensor when the weight is split
    for shard in w.local_shards:
        print(shard.shard_device, shard.indices, shard.data.shape)
"""

from __future__ import annotations

import dataclasses
import enum
from types import EllipsisType
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard
from torch.overrides import get_default_nowrap_functions

import lazyxla
from lazyxla import torch_private
from lazyxla.compat._common import platform_name
from lazyxla.compat.torch_xla import _XLAC
from lazyxla.lazy.tensor import LazyTensor, unwrap, wrap

aten = torch.ops.aten

_NO_SPEC = (
    "{what} must be specified to create DTensorSpec. If this tensor was created through torch operations, it may "
    "be auto-wrapped. Use wrap_as_sharded_tensor() to set {what} before accessing _spec."
)
_NO_PLACEMENTS = (
    "Placements not available: XLAShardedTensor requires mesh_shape and partition_spec to be set. Use "
    "mark_sharding() to properly initialize sharding information."
)


class ShardingType(enum.IntEnum):
    """torch_xla's sharding kinds (XLA's ``OpSharding`` types).

    Example::

        assert xs.ShardingType.TILED == 3
    """

    REPLICATED = 0
    MAXIMAL = 1
    TUPLE = 2
    TILED = 3
    MANUAL = 4
    PARTIAL = 5
    UNKNOWN = 6


@dataclasses.dataclass
class XLAShard:
    """One device's part of a sharded tensor: a host copy (``data``), where it lies in the global tensor
    (``indices``: one slice per dimension, or ``Ellipsis`` for a replicated tensor), the device it came from
    (``shard_device``, e.g. ``'CPU:3'``) and which copy of that part it is (``replica_id``; a replicated tensor's
    parts are numbered by device).

    Example::

        shard = xs.wrap_if_sharded(w).local_shards[0]
        shard.indices            # [slice(0, 16), slice(0, 64)]
    """

    data: torch.Tensor
    indices: list[slice] | EllipsisType
    shard_device: str
    replica_id: int

    @property
    def unpadded_data(self) -> torch.Tensor:
        """``data`` without padding: the part ``indices`` names (``data`` is longer where the layout splits a
        dimension unevenly: the last parts are padded, as in torch_xla).

        Example::

            shard.unpadded_data.shape == tuple(s.stop - s.start for s in shard.indices)
        """
        if self.indices is Ellipsis:
            return self.data
        return self.data[tuple(slice(0, s.stop - s.start) for s in self.indices)]


def _xla_shard(shard: lazyxla.spmd.Shard, replicated: bool) -> XLAShard:
    device = f"{platform_name()}:{shard.device}"
    if replicated:
        return XLAShard(shard.data, Ellipsis, device, shard.device)
    data = shard.data
    if shard.padded_shape and tuple(data.shape) != shard.padded_shape:  # torch_xla's parts carry XLA's padding
        data = torch.zeros(shard.padded_shape, dtype=data.dtype)
        data[tuple(slice(0, n) for n in shard.data.shape)] = shard.data
    return XLAShard(data, list(shard.index), device, shard.replica_id)


class XLAShardedTensor(DTensor):
    """A device tensor with its sharding, seen as a ``DTensor`` (what ``distribute_tensor`` returns for an
    ``'xla'`` DeviceMesh, and what ``xs.wrap_if_sharded`` makes of a sharded tensor).

    Example::

        mesh = DeviceMesh("xla", torch.arange(n))
        t = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])    # an XLAShardedTensor
        t.placements                                                    # (Shard(dim=0),)
        t.global_tensor                                                 # the sharded device tensor
    """

    global_tensor: torch.Tensor
    mesh_shape: tuple[int, ...] | None
    partition_spec: tuple | None

    @staticmethod
    def __new__(cls, elem: torch.Tensor, mesh_shape=None, partition_spec=None, *args, **kwargs):
        requires_grad = kwargs.get("requires_grad", False)
        r = torch_private.make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=elem.device,
            requires_grad=requires_grad,
        )
        r.global_tensor = elem.detach() if requires_grad else elem
        inherited = isinstance(elem, XLAShardedTensor)
        r.mesh_shape = mesh_shape or (elem.mesh_shape if inherited else None)
        r.partition_spec = partition_spec or (elem.partition_spec if inherited else None)
        r._cached_spec = None
        return r

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()

    @property
    def local_shards(self) -> list[XLAShard]:
        """Host copies of the parts this process's devices hold, in device order.

        Example::

            [s.indices for s in xs.wrap_if_sharded(w).local_shards]
        """
        replicated = self.sharding_type == ShardingType.REPLICATED
        return [_xla_shard(s, replicated) for s in lazyxla.spmd.local_shards(self.global_tensor)]

    def load_local_shards_(self, shards: list[XLAShard]) -> None:
        """Replace the devices' parts with ``shards`` (as ``local_shards`` lists them), keeping the layout.

        Example::

            shards = xt.local_shards
            for s in shards:
                s.data.zero_()
            xt.load_local_shards_(shards)

        As torch_xla's, it raises ``RuntimeError`` for a tensor without a layout or a replicated one (copy into
        it instead), for a list missing a device's part and for a part of the wrong shape.
        """
        if self.sharding_type == ShardingType.REPLICATED:
            raise RuntimeError(
                "Replicated tensor should not be loaded from _load_local_shards - use copy_ (load_local_shards_ "
                "replaces the parts of a tensor split over the devices)"
            )
        shard_shape = _shard_shape(self)
        wrong = [list(s.data.shape) for s in shards if shard_shape and list(s.data.shape) != shard_shape]
        if wrong:
            raise RuntimeError(f"Input shard shape must include padding: {wrong[0]} vs {shard_shape}")
        try:
            lazyxla.spmd.load_local_shards(self.global_tensor, [s.unpadded_data for s in shards])
        except ValueError as e:  # a part missing or of the wrong shape: torch_xla's check raises RuntimeError
            raise RuntimeError(str(e)) from e
        self.invalidate_spec_cache()

    @property
    def sharding_spec(self) -> str:
        """XLA's HLO sharding text of the layout (``''`` when the tensor has none), as
        ``torch_xla._XLAC._get_xla_sharding_spec`` gives it.

        Example::

            xs.mark_sharding(t, xs.Mesh(np.arange(4), (4,)), (0, None)).sharding_spec   # '{devices=[4,1]0,1,2,3}'
        """
        return _XLAC._get_xla_sharding_spec(self.global_tensor)

    @property
    def sharding_type(self) -> ShardingType:
        """How the tensor is laid out (``ShardingType``): REPLICATED, TILED (every device holds a different
        part) or PARTIAL (parts are repeated over some mesh axes).

        Example::

            xs.wrap_if_sharded(w).sharding_type == xs.ShardingType.TILED
        """
        return sharding_type_of(self.global_tensor)

    def __repr__(self) -> str:
        return f"XLAShardedTensor({self.global_tensor})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # As torch_xla's: PyTorch's own handling (torch.Tensor.__torch_function__; DTensor's is skipped), so
        # autograd records on the wrappers and each aten op then reaches __torch_dispatch__. A result PyTorch made
        # of a plain tensor (an op that also took a plain device tensor) becomes an XLAShardedTensor through
        # ``as_subclass``, with no wrapped tensor in torch_xla; here it wraps that plain result and has no mesh.
        with torch_private.disable_torch_function_subclass():
            out = func(*args, **(kwargs or {}))
        if func in get_default_nowrap_functions():
            return out
        if isinstance(out, tuple | list):
            return type(out)(_adopt(x) for x in out)
        return _adopt(out)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run_on_global(func, args, kwargs or {})

    @property
    def _spec(self) -> Any:
        """The layout as a ``DTensorSpec`` (an ``'xla'`` DeviceMesh of ``mesh_shape`` over the run's devices and
        one placement per mesh axis), built once and cached until :meth:`invalidate_spec_cache`.

        Example::

            spec = t._spec; spec.placements      # (Shard(dim=0), Replicate())
        """
        if self._cached_spec is None:
            self._cached_spec = _dtensor_spec(self)
        return self._cached_spec

    @property
    def placements(self) -> tuple[Placement, ...]:
        """One placement per mesh axis: ``Shard(dim)`` when tensor dimension ``dim`` is split over it, else
        ``Replicate()``.

        Example::

            t.placements == (Shard(0),)
        """
        try:
            return self._spec.placements
        except ValueError:
            raise ValueError(_NO_PLACEMENTS) from None

    def invalidate_spec_cache(self) -> None:
        """Forget the cached ``_spec`` (the mesh or partition spec changed).

        Example::

            t.invalidate_spec_cache()
        """
        self._cached_spec = None

    def redistribute(self, device_mesh, placements, *, async_op: bool = False) -> XLAShardedTensor:
        """The tensor laid out over ``device_mesh`` (a torch_xla ``xs.Mesh``, as torch_xla's takes, or a DTensor
        ``DeviceMesh``) as ``placements`` say, one per mesh axis; the wrapped tensor is annotated again in place,
        or a copy of it when ``async_op``.

        Example::

            st = xs.mark_sharding(t, mesh, (0, None))
            st.redistribute(mesh, [Shard(1)]).partition_spec      # (None, 0)
        """
        mesh = _lazyxla_mesh(device_mesh)
        if len(placements) != len(mesh.mesh_shape):
            raise ValueError(
                f"Number of placements ({len(placements)}) must match mesh dimensions ({len(mesh.mesh_shape)})"
            )
        if any(isinstance(p, Partial) for p in placements):
            raise NotImplementedError("Partial placement is not supported; use Shard or Replicate placements")
        spec = placements_to_partition_spec(self.global_tensor, placements)
        target = self.global_tensor.clone() if async_op else self.global_tensor
        names = mesh.axis_names
        lazyxla.spmd.mark_sharding(target, mesh, tuple(None if a is None else names[a] for a in spec))
        return XLAShardedTensor(target, mesh_shape=tuple(mesh.mesh_shape), partition_spec=spec)


def _lazyxla_mesh(device_mesh) -> lazyxla.spmd.Mesh:
    """The ``lazyxla.spmd.Mesh`` of a torch_xla ``xs.Mesh`` (it has one) or of a DTensor ``DeviceMesh``."""
    if isinstance(device_mesh, DeviceMesh):
        names = device_mesh.mesh_dim_names or tuple(f"axis{i}" for i in range(device_mesh.ndim))
        return lazyxla.spmd.Mesh(device_mesh.mesh.flatten().tolist(), tuple(device_mesh.mesh.shape), names)
    return device_mesh.lazyxla_mesh


def _run_on_global(func, args, kwargs):
    """One aten op that reached the wrappers below autograd, computed on their ``global_tensor``s.

    Functionalization has already run by then (PyTorch excludes its key inside ``__torch_dispatch__``), so the op
    runs on the LazyTensors inside the global tensors, as functionalization would run it: a view through
    functionalization's own view kernel (the result aliases the global tensor: writes through it reach it), an
    in-place op on a fresh alias that then replaces the global tensor's value (functionalization's update, which
    its views see). When functionalization called here (a plain device tensor among the arguments, already
    unwrapped), the results go back to it unwrapped.
    """
    if any(isinstance(x, LazyTensor) for x in torch_private.tree_leaves((args, kwargs))):
        return func(*_unwrapped(args), **_unwrapped(kwargs))
    schema = func._schema
    if not schema.is_mutable and any(r.alias_info is not None for r in schema.returns):
        view = torch_private.computed_kernel(func.name(), "Functionalize")
        out = view.call_boxed(_FUNCTIONAL_KEYS, *_globals(args), **_globals(kwargs))
        return torch_private.tree_map(_wrap, out)
    inner_args, inner_kwargs = _unwrapped(args), _unwrapped(kwargs)
    writes = []  # (a wrapper the op writes to, the list or dict its LazyTensor sits in for the call, where)
    returned = {}  # an argument the op writes to (a wrapper or a list of them), by its alias set
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        holder, key = (inner_args, i) if i < len(args) else (inner_kwargs, arg.name)
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        returned[frozenset(arg.alias_info.before_set)] = value
        if isinstance(value, list | tuple):  # _foreach_*_ ops (optimizers) write lists of tensors
            writes += [(w, holder[key], j) for j, w in enumerate(value) if isinstance(w, XLAShardedTensor)]
        elif isinstance(value, XLAShardedTensor):
            writes.append((value, holder, key))
    for _, container, where in writes:
        if isinstance(container[where], LazyTensor):
            container[where] = aten.alias.default(container[where])
    out = func(*inner_args, **inner_kwargs)
    for wrapper, container, where in writes:
        if isinstance(container[where], LazyTensor):
            torch_private.replace_inner(wrapper.global_tensor, container[where])
    return _results(schema, out, returned)


def _results(schema, out, returned: dict):
    """The op's results as torch_xla gives them: for a result that aliases an argument the op wrote to, that
    argument; any other result wrapped again."""
    if not schema.returns:
        return out
    outs = out if isinstance(out, tuple) else (out,)
    results = []
    for ret, value in zip(schema.returns, outs):
        alias = None if ret.alias_info is None else frozenset(ret.alias_info.before_set)
        results.append(returned[alias] if alias in returned else torch_private.tree_map(_wrap, value))
    return tuple(results) if isinstance(out, tuple) else results[0]


# functionalization's view kernels are called with the keys of a functional device tensor
_FUNCTIONAL_KEYS = torch_private.DispatchKeySet(torch_private.DispatchKey.Functionalize).add(
    torch_private.DispatchKey.PrivateUse1
)


def _global(x):
    return x.global_tensor if isinstance(x, XLAShardedTensor) else x


def _globals(tree):
    return torch_private.tree_map(_global, tree)


def _inner(x):
    """The LazyTensor inside a wrapper's or a functional device tensor (any other value as it is)."""
    x = _global(x)
    return unwrap(x) if isinstance(x, torch.Tensor) and torch_private.is_functional(x) else x


def _unwrapped(tree):
    """The op's arguments or a list among them (as a list) or its keyword arguments (a dict) with LazyTensors for
    device tensors."""
    if isinstance(tree, dict):
        return {k: _unwrapped(v) if isinstance(v, list | tuple) else _inner(v) for k, v in tree.items()}
    return [_unwrapped(v) if isinstance(v, list | tuple) else _inner(v) for v in tree]


def _wrap(x):
    """An op's result as torch_xla gives it: a device result wrapped again (knowing no mesh), as is a host one."""
    if isinstance(x, LazyTensor):
        x = wrap(x)
    return XLAShardedTensor(x) if isinstance(x, torch.Tensor) and not isinstance(x, XLAShardedTensor) else x


def _shard_shape(t: XLAShardedTensor) -> list[int] | None:
    """The shape of each device's part as ``local_shards`` gives it (a dimension split in k: ceil(n / k), padded
    as in torch_xla), from the wrapper's mesh shape and partition spec; None when it knows none."""
    if t.mesh_shape is None or t.partition_spec is None:
        return None
    shape = []
    for n, axes in zip(t.shape, t.partition_spec):
        parts = 1
        for axis in () if axes is None else axes if isinstance(axes, tuple) else (axes,):
            if not isinstance(axis, int):  # (the wrapper keeps axis indices; anything else: no check)
                return None
            parts *= t.mesh_shape[axis]
        shape.append(-(-n // parts))
    return shape


def _adopt(x):
    """A plain tensor an op returned, as torch.Tensor.__torch_function__ gives it (``as_subclass``, which keeps
    its autograd history), with itself as its wrapped tensor and no mesh; any other value as it is."""
    if not isinstance(x, torch.Tensor) or isinstance(x, XLAShardedTensor):
        return x
    out = x.as_subclass(XLAShardedTensor)  # an alias of x: the Python key is set on it, not on x
    out.global_tensor = x
    out.mesh_shape = out.partition_spec = out._cached_spec = None
    return out


def sharding_type_of(t: torch.Tensor) -> ShardingType:
    """``t``'s ``ShardingType`` from its layout (REPLICATED when it is not split).

    Example::

        sharding_type_of(w) == ShardingType.TILED
    """
    kind = ShardingType
    layout = lazyxla.spmd.get_sharding(t) if lazyxla.spmd.is_enabled() else None
    if layout is None:
        return kind.REPLICATED
    mesh, spec = layout
    if mesh is None:  # a layout XLA chose that no mesh of this run describes
        return kind.TILED
    used = [a for entry in spec if entry is not None for a in ((entry,) if isinstance(entry, str) else entry)]
    split = 1
    for axis in used:
        split *= mesh.axis_size(axis)
    return kind.TILED if split == len(mesh.device_ids) else kind.PARTIAL


def _dtensor_spec(t: XLAShardedTensor) -> Any:
    if t.mesh_shape is None:
        raise ValueError(_NO_SPEC.format(what="mesh_shape"))
    if t.partition_spec is None:
        raise ValueError(_NO_SPEC.format(what="partition_spec"))
    ids = torch.arange(lazyxla.spmd.device_count()).reshape(t.mesh_shape)
    mesh = DeviceMesh("xla", ids)
    placements = []
    for axis in range(len(t.mesh_shape)):
        dims = [d for d, entry in enumerate(t.partition_spec) if entry == axis]
        placements.append(Shard(dims[0]) if dims else Replicate())
    g = t.global_tensor
    return torch_private.dtensor_spec(mesh, tuple(placements), g.shape, g.stride(), g.dtype)


def placements_to_partition_spec(t: torch.Tensor, placements) -> tuple:
    """DTensor ``placements`` (one per mesh axis) as a partition spec (one mesh-axis index or None per tensor
    dimension).

    Example::

        placements_to_partition_spec(torch.zeros(4, 8, 8), [Replicate(), Shard(0)])   # (1, None, None)
    """
    spec: list = [None] * t.dim()
    for axis, placement in enumerate(placements):
        if placement.is_shard():
            if not 0 <= placement.dim < t.dim():
                raise IndexError(f"Shard dimension {placement.dim} is out of bounds for a {t.dim()}-d tensor")
            spec[placement.dim] = axis
        elif not placement.is_replicate():
            raise ValueError(f"Unsupported placement type: {type(placement).__name__}")
    return tuple(spec)
