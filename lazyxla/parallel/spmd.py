"""SPMD: a device mesh, sharding annotations on tensors, and XLA's partitioner doing the rest.

In SPMD mode (``enable()``) the lazyxla device stands for every device of the run: device tensors are
global ``jax.Array``s, replicated unless annotated, and each sync compiles one program that XLA
partitions over all devices from the shardings of its inputs and the constraints recorded in the
graph (GSPMD / Shardy propagation; no hand-written collectives). ``mark_sharding`` on a computed
tensor re-lays its buffer out now; on a pending one it records a sharding constraint
(``ops.shard``, lowered to ``jax.lax.with_sharding_constraint``).

A partition spec has one entry per tensor dimension: a mesh axis name, ``None`` (not split), or a
tuple of axis names (split over their product). A dimension its axes do not divide evenly is split as XLA
and torch_xla split it: in parts of ``ceil(size / parts)``, the last ones short (XLA pads them inside the
programs). jax keeps buffers only in even layouts, so such a tensor's buffer holds those dimensions whole on
each device (``device/meshes.py``: ``even_spec``), while programs, ``get_sharding`` and ``local_shards`` see
the layout asked for.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import torch
from jax.sharding import NamedSharding

from lazyxla.device import devices, meshes
from lazyxla.device.meshes import Mesh, ShardingError
from lazyxla.ir import Aval, Leaf, leaf
from lazyxla.lazy import graph
from lazyxla.lazy.tensor import LazyTensor, live_tensors, rebind, unwrap, wrap
from lazyxla.observe.diagnostics import user_frame
from lazyxla.ops import ops

_state: dict[str, Any] = {"enabled": False, "global_mesh": None}
_on_enable: list = []  # called by enable(), after the mode is on (modules above this one add to it)


def on_enable(hook) -> None:
    """Call ``hook()`` when SPMD mode is turned on (``parallel/dtensor.py`` installs its DTensor conversions so).

    Example::

        on_enable(lambda: print("SPMD on"))
    """
    _on_enable.append(hook)


def device_count() -> int:
    """Every device of the run (all processes).

    Example::

        mesh = lazyxla.spmd.mesh((lazyxla.spmd.device_count(),), ("fsdp",))
    """
    return len(devices.global_devices())


def mesh(mesh_shape: Sequence[int], axis_names: Sequence[str]) -> Mesh:
    """A mesh over every device of the run, in order (``-1`` in ``mesh_shape``: what is left).

    Example::

        mesh = lazyxla.spmd.mesh((2, -1), ("data", "model"))
    """
    shape = list(mesh_shape)
    n = device_count()
    if shape.count(-1) > 1:
        raise ShardingError(f"mesh: at most one -1 in mesh_shape, got {tuple(mesh_shape)}")
    if -1 in shape:
        rest = math.prod(s for s in shape if s != -1)
        if rest == 0 or n % rest:
            raise ShardingError(f"mesh: {n} devices cannot be laid out as {tuple(mesh_shape)}")
        shape[shape.index(-1)] = n // rest
    return Mesh(range(n), shape, axis_names)


def hybrid_mesh(ici_mesh_shape: Sequence[int], dcn_mesh_shape: Sequence[int], axis_names: Sequence[str]) -> Mesh:
    """A mesh over hosts x local devices: axis ``i`` spans ``dcn_mesh_shape[i]`` processes times
    ``ici_mesh_shape[i]`` devices of each, so that the fast (in-host) links carry the inner axes.

    Example::

        mesh = lazyxla.spmd.hybrid_mesh((1, 4), (2, 1), ("data", "model"))   # 2 hosts x 4 devices
    """
    ici, dcn = tuple(ici_mesh_shape), tuple(dcn_mesh_shape)
    if len(ici) != len(dcn) or len(ici) != len(axis_names):
        raise ShardingError("hybrid_mesh: ici_mesh_shape, dcn_mesh_shape and axis_names need the same length")
    run_devices = devices.global_devices()
    hosts = math.prod(dcn)
    local = math.prod(ici)
    if hosts * local != len(run_devices) or hosts != jax.process_count():
        raise ShardingError(
            f"hybrid_mesh: {hosts} hosts x {local} devices does not match the run "
            f"({jax.process_count()} processes, {len(run_devices)} devices)"
        )
    # ids[h_0, .., h_k, l_0, .., l_k] = h * local + l, then interleave host and local dims per axis
    k = len(ici)
    ids = np.arange(len(run_devices)).reshape(dcn + ici)
    ids = ids.transpose([a for i in range(k) for a in (i, k + i)]).reshape([d * c for d, c in zip(dcn, ici)])
    return Mesh(ids.reshape(-1), ids.shape, axis_names)


# --- SPMD mode -------------------------------------------------------------------------------------


def enable() -> None:
    """Turn SPMD mode on: ``lazyxla.device()`` stands for every device of the run. Call it before
    anything is put on a device.

    Example::

        lazyxla.spmd.enable()
        model = GPT().to(lazyxla.device())       # replicated on every device
        lazyxla.spmd.fsdp(model, lazyxla.spmd.mesh((-1,), ("fsdp",)))
    """
    if _state["enabled"]:
        return
    if live_tensors():
        raise RuntimeError(
            "lazyxla.spmd.enable() must come before any tensor is put on a lazyxla device; call it at the top of "
            "the script"
        )
    _state["enabled"] = True
    devices.set_spmd(True)
    for hook in _on_enable:  # parallel/dtensor.py: DTensors on lazyxla meshes hold global tensors
        hook()


def is_enabled() -> bool:
    """Whether SPMD mode is on.

    Example::

        if lazyxla.spmd.is_enabled(): ...
    """
    return _state["enabled"]


def replicated() -> NamedSharding:
    """Where a plain device tensor lives in SPMD mode: every device holds all of it.

    Example::

        x_layout = lazyxla.spmd.replicated()
    """
    return devices.replicated()


def set_global_mesh(m: Mesh | None) -> None:
    """Remember ``m`` as the run's mesh (what ``get_global_mesh`` returns; None forgets it).

    Example::

        lazyxla.spmd.set_global_mesh(lazyxla.spmd.mesh((-1,), ("data",)))
    """
    _state["global_mesh"] = m


def get_global_mesh() -> Mesh | None:
    """The mesh given to ``set_global_mesh``, or None.

    Example::

        mesh = lazyxla.spmd.get_global_mesh()
    """
    return _state["global_mesh"]


# --- annotations -----------------------------------------------------------------------------------


def _check_spec(shape: tuple[int, ...], m: Mesh, spec: Sequence) -> tuple:
    spec = tuple(spec)
    if len(spec) != len(shape):
        raise ShardingError(
            f"mark_sharding: the partition spec {spec} has {len(spec)} entries but the tensor has {len(shape)} "
            f"dimensions {list(shape)}; give one entry (axis name, None or tuple of names) per dimension"
        )
    used: list[str] = []
    out = []
    for dim, entry in enumerate(spec):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        for name in names:
            if not isinstance(name, str) or name not in m.axis_names:
                raise ShardingError(
                    f"mark_sharding: {name!r} (dimension {dim}) is not an axis of the mesh {m.axis_names}"
                )
            if name in used:
                raise ShardingError(f"mark_sharding: mesh axis {name!r} is used twice in {spec}")
            used.append(name)
        out.append(None if not names else names[0] if len(names) == 1 else names)
    return tuple(out)


def _inner(t: torch.Tensor):
    if not isinstance(t, torch.Tensor) or not devices.on_device(t):
        raise TypeError(f"expected a lazyxla tensor, got {t.device if isinstance(t, torch.Tensor) else type(t)}")
    return unwrap(t)


def _require_spmd(fn: str) -> None:
    if not _state["enabled"]:
        raise RuntimeError(f"{fn} needs SPMD mode: call lazyxla.spmd.enable() at the top of the script")


def mark_sharding(t: torch.Tensor, mesh: Mesh, partition_spec: Sequence) -> torch.Tensor:
    """Lay ``t`` out over ``mesh`` as ``partition_spec`` says; returns ``t`` (annotated in place).

    A computed tensor's buffer is re-laid out at once; a pending one gets a sharding constraint in
    the graph, which XLA's partitioner propagates.

    Example::

        lazyxla.spmd.mark_sharding(linear.weight, mesh, ("model", None))   # column-parallel
        lazyxla.spmd.mark_sharding(x, mesh, ("data", None))                # batch-sharded activations
    """
    _require_spmd("mark_sharding")
    lt = _inner(t)
    spec = _check_spec(tuple(t.shape), mesh, partition_spec)
    node, i = lt._value
    if node.op is Leaf.DATA:
        even = meshes.even_spec(mesh, spec, tuple(t.shape))
        out = leaf(Leaf.DATA, devices.relayout(node.payload, mesh.sharding(even)), node.avals[0], node.device)
        out.source = f"laid out by lazyxla.spmd.mark_sharding at {user_frame()}"
        meshes.relaid(out)
        if even != spec:  # split unevenly: the buffer keeps the even layout, the leaf the one asked for
            meshes.ask(out, mesh.key, json.dumps(spec))
        rebind(t, lt, (out, 0))
    else:
        out = ops.shard(LazyTensor(lt._value, lt._aval), mesh.key, json.dumps(spec))
        rebind(t, lt, out._value)
    return t


def clear_sharding(t: torch.Tensor) -> torch.Tensor:
    """Make ``t`` replicated again (drop its annotation); returns ``t``.

    Example::

        lazyxla.spmd.clear_sharding(x)
    """
    _require_spmd("clear_sharding")
    lt = _inner(t)
    node, i = lt._value
    if node.op is Leaf.DATA:
        out = leaf(Leaf.DATA, devices.relayout(node.payload, devices.replicated()), node.avals[0], node.device)
        out.source = f"laid out by lazyxla.spmd.clear_sharding at {user_frame()}"
        meshes.relaid(out)
        rebind(t, lt, (out, 0))
    elif node.op is ops.shard.default:
        rebind(t, lt, node.inputs[0])
    return t


def get_sharding(t: torch.Tensor) -> tuple[Mesh | None, tuple] | None:
    """``(mesh, partition_spec)`` of ``t``'s annotation, or None when it is replicated / unannotated.

    For a computed tensor it is the layout of its buffer, also when XLA's partitioner chose it (a step's
    outputs); ``(None, (description,))`` for a layout that matches no mesh built here.

    Example::

        mesh, spec = lazyxla.spmd.get_sharding(model.weight)
    """
    lt = _inner(t)
    node, _ = lt._value
    if node.op is ops.shard.default:
        return meshes.lookup(node.template[0][1]), meshes.decode_spec(node.template[0][2])
    if asked := meshes.asked(node):
        return meshes.lookup(asked[0]), meshes.decode_spec(asked[1])
    if node.op is Leaf.DATA and node.payload is not None:
        return meshes.spec_of_layout(node.payload.sharding, len(t.shape))
    return None


def is_annotated(t: torch.Tensor) -> bool:
    """Whether ``t`` is laid out over a mesh built here (``mark_sharding``, ``from_local``), a replicated
    spec included; False for a plain device tensor (every device holds all of it, no mesh named).

    Example::

        lazyxla.spmd.mark_sharding(x, mesh, (None, None))
        assert is_annotated(x) and lazyxla.spmd.get_sharding(x) is None
    """
    node, _ = _inner(t)._value
    if node.op is ops.shard.default or meshes.asked(node):
        return True
    layout = getattr(node.payload, "sharding", None) if node.op is Leaf.DATA else None
    return isinstance(layout, NamedSharding) and meshes.is_known(layout.mesh)


def from_local(t: torch.Tensor, mesh: Mesh, partition_spec: Sequence) -> torch.Tensor:
    """A device tensor laid out as ``partition_spec`` whose part on this process is the CPU tensor ``t``.

    The global tensor is every process's ``t`` concatenated along the sharded dimensions (in a single
    process: ``t`` itself): each host loads only its share of a batch. ``partition_spec`` may be
    shorter than ``t``'s rank (the rest is None).

    Example::

        x = lazyxla.spmd.from_local(local_batch, mesh, ("data",))
    """
    _require_spmd("from_local")
    spec = tuple(partition_spec) + (None,) * (t.dim() - len(partition_spec))
    local = devices.host_array(t)
    sharding = mesh.sharding(spec)
    with devices.x64():
        arr = jax.make_array_from_process_local_data(sharding, local)
    _check_spec(tuple(arr.shape), mesh, spec)
    aval = Aval(tuple(arr.shape), t.dtype)
    n = leaf(Leaf.DATA, arr, aval, 0)
    n.source = f"made by lazyxla.spmd.from_local at {user_frame()}"
    # fresh device data: a DeviceLoader(input_sharding=...) makes it on its own thread (lazy/session.py's policy)
    return wrap(LazyTensor((n, 0), aval, fresh=True))


# --- local shards (checkpointing) ------------------------------------------------------------------


@dataclasses.dataclass
class Shard:
    """One device's part of an SPMD tensor, as :func:`local_shards` returns it.

    ``device`` is the device's position among the run's devices (the ids a mesh is built from), ``index`` the
    part's place in the global tensor (one ``slice(start, stop)`` per dimension), ``replica_id`` which copy of
    that part this is (0 .. copies - 1) and ``data`` a CPU copy of it. ``padded_shape`` is the part's shape as
    XLA holds it: larger than ``data``'s where the layout splits a dimension unevenly (the last parts are
    short, or empty, and padded to ``ceil(size / parts)``).

    Example::

        for s in lazyxla.spmd.local_shards(w):
            print(s.device, s.index, s.replica_id, s.data.shape)
    """

    device: int
    index: tuple[slice, ...]
    replica_id: int
    data: torch.Tensor
    padded_shape: tuple[int, ...] = ()


def _computed(t: torch.Tensor, fn: str) -> tuple[LazyTensor, jax.Array]:
    """``t``'s inner tensor, computed (its pending work run), and its device buffer."""
    _require_spmd(fn)
    lt = _inner(t)
    graph.sync_tensors([lt], reason=fn)
    return lt, lt._value[0].payload


def _addressable(arr: jax.Array) -> tuple[list, dict]:
    """The buffers of ``arr`` on this process's devices, in the run's device order."""
    order = {d: i for i, d in enumerate(devices.global_devices())}
    return sorted(arr.addressable_shards, key=lambda s: order[s.device]), order


def _full_index(index: tuple, shape: tuple[int, ...]) -> tuple[slice, ...]:
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
    return tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape))


def local_shards(t: torch.Tensor) -> list[Shard]:
    """The parts of ``t`` this process's devices hold, copied to the host, in device order (``t``'s pending
    work is computed first). A replicated tensor has one whole-tensor part per device.

    Example::

        lazyxla.spmd.mark_sharding(w, mesh, ("data", None))
        shards = lazyxla.spmd.local_shards(w)       # one (rows/n, cols) part per device
    """
    lt, arr = _computed(t, "lazyxla.spmd.local_shards")
    shards, order = _addressable(arr)
    shape = tuple(arr.shape)
    uneven = _uneven_parts(lt._value[0], shape)
    out = []
    for s in shards:
        held = _full_index(s.index, shape)
        index, replica_id, padded = uneven[s.device] if uneven else (held, s.replica_id, tuple(s.data.shape))
        inside = tuple(slice(i.start - h.start, i.stop - h.start) for i, h in zip(index, held))
        out.append(Shard(order[s.device], index, replica_id, devices.to_host(s.data, lt.dtype)[inside], padded))
    return out


def _padded(m: Mesh, spec: tuple, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` grown to the next multiple of each dimension's part count (XLA's padding)."""
    return tuple(-(-n // k) * k for n, k in zip(shape, meshes.parts(m, spec)))


def _uneven_parts(node, shape: tuple[int, ...]) -> dict:
    """For a leaf laid out unevenly (``meshes.asked``): device -> (its part's index, replica id, padded part
    shape), as XLA splits the padded tensor; {} for any other."""
    asked = meshes.asked(node)
    if not asked:
        return {}
    m, spec = meshes.lookup(asked[0]), meshes.decode_spec(asked[1])
    padded = _padded(m, spec, shape)
    where = m.sharding(spec).devices_indices_map(padded)
    out, copies = {}, collections.Counter()
    for d in devices.global_devices():
        if d in where:
            index = tuple(slice(min(s.start, n), min(s.stop, n)) for s, n in zip(_full_index(where[d], padded), shape))
            part = tuple(s.stop - s.start for s in _full_index(where[d], padded))
            place = tuple((s.start, s.stop) for s in index)  # (slices are not hashable before Python 3.12)
            out[d] = (index, copies[place], part)
            copies[place] += 1
    return out


def load_local_shards(t: torch.Tensor, data: Sequence[torch.Tensor]) -> torch.Tensor:
    """Replace the parts of ``t`` on this process's devices with the CPU tensors ``data`` (in the order of
    :func:`local_shards`), keeping ``t``'s layout; views of ``t`` see the new values. Returns ``t``.

    Example::

        parts = [s.data * 2 for s in lazyxla.spmd.local_shards(w)]
        lazyxla.spmd.load_local_shards(w, parts)     # w is now 2 * w, laid out as before
    """
    lt, arr = _computed(t, "lazyxla.spmd.load_local_shards")
    shards, _ = _addressable(arr)
    if len(data) != len(shards):
        raise ValueError(f"load_local_shards: {len(data)} parts given, but {len(shards)} devices hold a part of it")
    node = lt._value[0]
    shape = tuple(arr.shape)
    uneven = _uneven_parts(node, shape)
    buffers = []
    with devices.x64():
        for shard, part in zip(shards, data):
            index, _, padded = uneven[shard.device] if uneven else (None, 0, tuple(shard.data.shape))
            expected = tuple(s.stop - s.start for s in index) if uneven else padded
            if tuple(part.shape) != expected:
                raise ValueError(
                    f"load_local_shards: the part for device {shard.device} has shape {list(part.shape)}, "
                    f"expected {list(expected)}"
                )
            host = devices.host_array(part.to(lt.dtype))
            if uneven:  # XLA's padded part: the data, then zeros
                host = np.pad(host, [(0, p - n) for p, n in zip(padded, host.shape)])
            buffers.append(devices.send_to(host, shard.device))
        new = _assemble(buffers, arr, meshes.asked(node), shape)
    out = leaf(Leaf.DATA, new, node.avals[0], node.device)
    out.source = f"loaded by lazyxla.spmd.load_local_shards at {user_frame()}"
    if uneven:
        meshes.ask(out, *meshes.asked(node))
    rebind(t, lt, (out, 0))
    return t


def _assemble(buffers: list, arr: jax.Array, asked: tuple, shape: tuple[int, ...]) -> jax.Array:
    """The global array of the devices' parts ``buffers``, laid out as ``arr``. Parts of an uneven layout are
    padded: they make the padded tensor, which a program cuts to ``shape`` in ``arr``'s (even) layout, gathering
    the uneven dimensions from every process's devices."""
    if not asked:
        return jax.make_array_from_single_device_arrays(arr.shape, arr.sharding, buffers)
    m, spec = meshes.lookup(asked[0]), meshes.decode_spec(asked[1])
    padded = jax.make_array_from_single_device_arrays(_padded(m, spec, shape), m.sharding(spec), buffers)
    return _cut(shape, arr.sharding)(padded)


@functools.lru_cache(maxsize=64)
def _cut(shape: tuple[int, ...], layout) -> Any:
    """A program taking the first ``shape`` elements of a padded tensor, returned laid out as ``layout``."""
    return jax.jit(lambda a: a[tuple(slice(0, n) for n in shape)], out_shardings=layout)


def fsdp(module: torch.nn.Module, mesh: Mesh, axis: str = "fsdp") -> torch.nn.Module:
    """Shard every parameter of ``module`` over mesh axis ``axis`` (FSDP-style); returns ``module``.

    Each parameter is split along its first dimension that divides evenly by the axis size (others stay
    replicated). Optimizer state made from the parameters (momentum, Adam moments) follows their layout
    through XLA's propagation; the gathers and reduce-scatters are XLA's.

    Example::

        mesh = lazyxla.spmd.mesh((-1,), ("fsdp",))
        lazyxla.spmd.fsdp(model, mesh)
        opt = torch.optim.AdamW(model.parameters())
    """
    _require_spmd("fsdp")
    if axis not in mesh.axis_names:
        raise ShardingError(f"fsdp: {axis!r} is not an axis of the mesh {mesh.axis_names}")
    n = mesh.axis_size(axis)
    for p in module.parameters():
        dim = next((d for d, s in enumerate(p.shape) if s % n == 0), None)
        if dim is not None:
            spec = [None] * p.dim()
            spec[dim] = axis
            with torch.no_grad():
                mark_sharding(p, mesh, spec)
    return module
