"""sync(): turn pending tensors into device data by compiling (once) and running their graph."""

from __future__ import annotations

import gc

from lazyxla.config import config
from lazyxla.device import runtime
from lazyxla.device.runtime import x64
from lazyxla.lazy import metrics
from lazyxla.lazy.ir import Leaf, leaf, raise_if_error
from lazyxla.lazy.tensor import LazyTensor, live_tensors


def _walk(roots):
    """Post-order of computation nodes, leaves in first-visit order, and the graph's sharing events.

    Root hashes fix the graph up to sharing; the events (edge number -> earlier node) make the key
    exact: two graphs with equal hashes and equal events are the same program.
    """
    order, leaves, events = [], [], []
    ref: dict[int, int] = {}
    edge = 0
    stack = [(m, False, -1) for m, _ in reversed(roots)]
    while stack:
        n, expanded, e = stack.pop()
        if expanded:
            order.append(n)
            continue
        k = id(n)
        if k in ref:
            events.append((e, ref[k]))
            continue
        ref[k] = len(ref)
        if n.op.__class__ is Leaf:
            leaves.append(n)
            continue
        stack.append((n, True, -1))
        for m, _ in reversed(n.inputs):
            edge += 1
            stack.append((m, False, edge))
    return order, leaves, tuple(events)


def plan(tensors: list[LazyTensor]) -> tuple[list, list, list, tuple]:
    """The graph computing ``tensors``: its roots (distinct values, in hash order), computation nodes in
    post-order, leaves, and sharing events (see ``_walk``)."""
    values = {}
    for t in tensors:
        values.setdefault((id(t._value[0]), t._value[1]), t._value)
    roots = sorted(values.values(), key=lambda v: (v[0].hash, v[1]))
    return (roots, *_walk(roots))


def _run(device: int, tensors: list[LazyTensor], full: bool) -> None:
    from lazyxla.lowering import cache

    with metrics.timer("trace"):
        roots, order, leaves, events = plan(tensors)
        donate = _donatable(leaves, tensors) if full and config.donate else ()
        key = (
            device,
            tuple((m.hash, i) for m, i in roots),
            tuple(leaf.avals[0] for leaf in leaves),
            events,
            tuple(donate),  # a program donates buffers: one compiled for other donations would free held data
            _layouts(leaves) if runtime.spmd_enabled() else None,
            config.compile_key(),
        )
    try:
        compiled = cache.get(key, order, leaves, roots, device, donate)
        layout = compiled.layout
        args = layout.arguments([_arg(leaves[i]) for i in layout.data], leaves)
        if compiled.replicas is not None:
            args = compiled.replicas.globalize(args)
        elif compiled.spmd:  # the packed scalars and RNG keys, the same in every process
            args[len(layout.data) :] = [runtime.put_global(a, runtime.replicated()) for a in args[len(layout.data) :]]
        with metrics.timer("execute"), x64():
            outs = compiled.executable(*args)
        if compiled.replicas is not None:
            outs = compiled.replicas.localize(outs, [m.avals[i] for m, i in roots])
    except Exception as e:
        # These tensors can never be computed: mark them so later syncs skip them and reads re-raise.
        for t in tensors:
            m, i = t._value
            t._value = (leaf(Leaf.ERROR, e, m.avals[i], device), 0)
        raise
    metrics.inc("executions")
    for i in compiled.donated:  # the buffer now belongs to an output; nothing may read it again
        leaves[i].payload = None
    new = {}
    for (m, i), arr in zip(roots, outs):
        new[(id(m), i)] = (leaf(Leaf.DATA, arr, m.avals[i], device), 0)
    for t in tensors:
        t._value = new[(id(t._value[0]), t._value[1])]


def _layouts(leaves) -> tuple:
    """SPMD: the layouts of the data leaves (a program is compiled for its inputs' layouts), canonical:
    a step's outputs come back in layouts XLA chose (``GSPMDSharding``), equivalent to the ``NamedSharding``
    the same tensors had as inputs, and must key the same program."""
    return tuple(
        _canonical_layout(n.payload.sharding, len(n.avals[0].shape))
        if n.op is Leaf.DATA and n.payload is not None
        else None
        for n in leaves
    )


_layout_keys: dict = {}


def _canonical_layout(sharding, ndim: int):
    key = (sharding, ndim)
    try:
        return _layout_keys[key]
    except KeyError:
        devices = tuple(d.id for d in sharding._device_assignment)
        canon = _layout_keys[key] = (str(sharding._to_xla_hlo_sharding(ndim)), devices)
        return canon


def _arg(n):
    """A data leaf's device array (scalars and RNG keys travel packed: see ``to_jax.ArgLayout``)."""
    raise_if_error(n)
    if n.payload is None:
        raise RuntimeError("lazyxla internal error: a donated buffer was used again")
    return n.payload


def _donatable(leaves, pending) -> list[int]:
    """Inputs no live tensor holds after this step: their buffers can be donated to its outputs."""
    pending_ids = {id(t) for t in pending}
    held = {id(t._value[0]) for t in live_tensors() if id(t) not in pending_ids}
    return tuple(i for i, n in enumerate(leaves) if n.op is Leaf.DATA and id(n) not in held)


def _group(tensors):
    by_device: dict[int, list] = {}
    for t in tensors:
        by_device.setdefault(t._value[0].device, []).append(t)
    return by_device


def sync(wait: bool = False) -> None:
    """Compile (once per graph) and run every pending lazyxla computation.

    Returns as soon as the work is queued on the device; host reads (``.item()``, ``.cpu()``) wait
    for it. ``wait=True`` blocks until the device has finished.

    Example::

        loss = model(x).sum(); loss.backward(); opt.step()
        lazyxla.sync()          # one XLA program for the whole step
    """
    metrics.inc("syncs")
    pending = [t for t in live_tensors() if t._value[0].op.__class__ is not Leaf]
    for device, ts in _group(pending).items():
        _run(device, ts, full=True)
    _freeze_gc_once()
    if wait:
        wait_device_ops()


_gc_frozen = False


def _freeze_gc_once() -> None:
    """``config.freeze_gc``: the first full sync freezes what is alive then (see the flag's help)."""
    global _gc_frozen
    if not _gc_frozen and config.freeze_gc:
        _gc_frozen = True
        gc.freeze()


def sync_tensors(tensors: list[LazyTensor], reason: str = "") -> None:
    """Compute just these tensors (and every live tensor that shares their values)."""
    want = {(id(t._value[0]), t._value[1]) for t in tensors if t._value[0].op.__class__ is not Leaf}
    if not want:
        return
    metrics.inc("syncs")
    pending = [t for t in live_tensors() if (id(t._value[0]), t._value[1]) in want]
    for device, ts in _group(pending).items():
        _run(device, ts, full=False)


def wait_device_ops() -> None:
    """Block until every device buffer that live tensors hold is computed.

    Example::

        lazyxla.sync(); lazyxla.wait_device_ops()   # e.g. before timing
    """
    for t in live_tensors():
        n = t._value[0]
        if n.op is Leaf.DATA and n.payload is not None:
            n.payload.block_until_ready()
