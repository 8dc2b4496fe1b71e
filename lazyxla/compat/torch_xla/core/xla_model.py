"""``torch_xla.core.xla_model`` (``xm``) on lazyxla.

The device, the step marker, replica facts, collectives, gradient averaging, checkpoints and the RNG,
with torch_xla's names, signatures and defaults, each mapped onto lazyxla (``lazyxla.device``,
``lazyxla.mark_step``, ``lazyxla.runtime``, ``lazyxla.all_reduce``, ``lazyxla.optimizer_step``, ...).
``pin_layout`` is accepted everywhere and has no effect (lazyxla lets XLA choose layouts).

Example::

    import torch_xla.core.xla_model as xm
    dev = xm.xla_device()
    loss = model(x.to(dev)).sum(); loss.backward()
    xm.optimizer_step(opt)          # gradients averaged over the replicas, then opt.step()
    xm.mark_step()                  # one compiled program per step
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import lazyxla
from lazyxla.compat._common import missing_attribute, platform_name, stub, unsupported
from lazyxla.device import devices
from lazyxla.device.devices import on_device
from lazyxla.lazy import graph, rng
from lazyxla.lazy.tensor import unwrap
from lazyxla.observe import metrics
from lazyxla.util import atomic_write, map_tensors, require_parent_folder

# torch_xla's op library, ``torch.ops.xla``: custom_kernel defines its kernels on it (``XLA_LIB.define(...)``, then
# ``torch.library.impl(XLA_LIB, name, key)``), and so can user code written for torch_xla. This module is imported
# once per process (install/uninstall only alias it as ``torch_xla.core.xla_model``), so the library is made once. A
# FRAGMENT rather than torch_xla's DEF: the same definitions, without claiming the whole namespace (a DEF fails in a
# process where anything else defines ``xla`` ops).
XLA_LIB = torch.library.Library("xla", "FRAGMENT")

REDUCE_SUM = "sum"
REDUCE_MUL = "mul"
REDUCE_AND = "and"
REDUCE_OR = "or"
REDUCE_MIN = "min"
REDUCE_MAX = "max"

_REDUCE_OPS = {
    REDUCE_SUM: lazyxla.ReduceOp.SUM,
    REDUCE_MUL: lazyxla.ReduceOp.MUL,
    REDUCE_AND: lazyxla.ReduceOp.AND,
    REDUCE_OR: lazyxla.ReduceOp.OR,
    REDUCE_MIN: lazyxla.ReduceOp.MIN,
    REDUCE_MAX: lazyxla.ReduceOp.MAX,
}

# Step closures: run, in the order added, after the next mark_step (xm.mark_step, torch_xla.sync, the
# MpDeviceLoader's per-step marker, optimizer_step(barrier=True), the end of torch_xla.compile regions).
_closures: list[Callable[[], Any]] = []
_closures_lock = threading.Lock()


def _reduce_op(reduce_type, fn: str) -> lazyxla.ReduceOp:
    if isinstance(reduce_type, lazyxla.ReduceOp):
        return reduce_type
    try:
        return _REDUCE_OPS[reduce_type]
    except (KeyError, TypeError):
        raise ValueError(
            f"xm.{fn}: reduce_type must be one of xm.REDUCE_SUM, REDUCE_MUL, REDUCE_AND, REDUCE_OR, REDUCE_MIN, "
            f"REDUCE_MAX; got {reduce_type!r}"
        ) from None


def _groups(groups):
    return [list(g) for g in groups] if groups else None


def _spmd() -> bool:
    return lazyxla.spmd.is_enabled()


# --- devices ---------------------------------------------------------------------------------------


def xla_device(n: int | None = None, devkind: str | None = None) -> torch.device:
    """The device of this replica: ``xla:n`` (default ``xla:0``; ``lazyxla:n`` where the device keeps lazyxla's
    name: ``lazyxla.compat.install()`` after ``import lazyxla``). ``devkind`` is deprecated in
    torch_xla and ignored here (lazyxla runs on jax's default backend).

    Example::

        dev = xm.xla_device()
        model = model.to(dev)
    """
    if devkind is not None:
        warnings.warn("xm.xla_device: `devkind` is deprecated and ignored by lazyxla", DeprecationWarning, stacklevel=2)
    return lazyxla.device(n)


def get_xla_supported_devices(devkind: str | None = None, max_devices: int | None = None) -> list[str]:
    """The device names of this process, e.g. ``['xla:0']``.

    Example::

        print(xm.get_xla_supported_devices())
    """
    names = [str(d) for d in lazyxla.devices()]
    return names[:max_devices] if max_devices else names


def xla_device_hw(device) -> str:
    """The hardware behind ``device``: ``'CPU'``, ``'CUDA'`` or ``'TPU'`` (jax's platform).

    Example::

        if xm.xla_device_hw(xm.xla_device()) == "TPU": ...
    """
    dev = torch.device(device)
    if not on_device(dev):
        raise RuntimeError(f"xm.xla_device_hw: {device} is not a lazyxla device")
    return platform_name()


def xla_real_devices(devices=None) -> list[str]:
    """The hardware names of ``devices`` (default: all of this process), e.g. ``['CPU:0']``.

    Example::

        print(xm.xla_real_devices())
    """
    devices = devices or lazyxla.devices()
    hw = platform_name()
    return [f"{hw}:{torch.device(d).index or 0}" for d in devices]


def xla_replication_devices(local_devices=None) -> list[str]:
    """The hardware names of every device a replicated run spans (all processes), ordered by ordinal, e.g.
    ``['CPU:0', 'CPU:1']``. As in torch_xla, ``local_devices`` must be all of this process's devices:
    replication happens among every device of one kind, never a subset.

    Example::

        print(xm.xla_replication_devices([xm.xla_device()]))       # ['CPU:0'] in a one-device run
    """
    local_devices = list(local_devices) if local_devices is not None else lazyxla.devices()
    foreign = [d for d in local_devices if not on_device(torch.device(d))]
    if foreign:
        raise RuntimeError(f"Cannot replicate across different device types: {foreign} are not lazyxla devices")
    supported = get_xla_supported_devices()
    if len(supported) != len(local_devices):
        raise RuntimeError(
            f"Cannot replicate over {len(local_devices)} devices: replication spans all {len(supported)} "
            "devices of this process"
        )
    hw = platform_name()
    return [f"{hw}:{i}" for i in range(lazyxla.spmd.device_count())]


def is_xla_tensor(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` lives on a lazyxla device.

    Example::

        assert xm.is_xla_tensor(torch.zeros(2, device=xm.xla_device()))
    """
    return on_device(tensor)


# --- replicas --------------------------------------------------------------------------------------


def set_replication(device, devices) -> None:
    """Declare ``device`` this thread's device and ``devices`` the devices it replicates over, as accelerate's
    ``PartialState`` does with ``xm.set_replication(xm.xla_device(), xm.get_xla_supported_devices())``.

    lazyxla's replicas are processes (``xmp.spawn``), each driving its devices itself, so there is nothing to
    set up: the call checks what torch_xla checks. ``devices`` (when not empty) must be every device of this
    process and hold ``device``; an empty list means no replication.

    Example::

        xm.set_replication(xm.xla_device(), xm.get_xla_supported_devices())
    """
    device = torch.device(device)
    if not on_device(device):
        raise RuntimeError(f"xm.set_replication: {device} is not a lazyxla device (use xm.xla_device())")
    names = [str(torch.device(d)) for d in devices or ()]
    if not names:
        return
    local = [str(d) for d in lazyxla.devices()]
    if sorted(names) != sorted(local):
        raise RuntimeError(
            f"xm.set_replication: cannot replicate over {names}: replication spans every device of the process "
            f"{local} (xm.get_xla_supported_devices()); replicas in other processes come from xmp.spawn"
        )
    if str(device) not in names:
        raise ValueError(f"xm.set_replication: {device} is not one of the replication devices {names}")


def xrt_world_size(defval: int = 1) -> int:
    """Replicas taking part in the run (one per process; 1 in a single process).

    Example::

        lr = base_lr * xm.xrt_world_size()
    """
    return lazyxla.runtime.world_size()


def get_ordinal(defval: int = 0) -> int:
    """This replica's index among all replicas, ``0 .. xrt_world_size() - 1``.

    Example::

        sampler = DistributedSampler(ds, xm.xrt_world_size(), xm.get_ordinal())
    """
    return lazyxla.runtime.global_ordinal()


def get_local_ordinal(defval: int = 0) -> int:
    """This replica's index among the replicas of its host.

    Example::

        print(xm.get_local_ordinal())
    """
    return lazyxla.runtime.local_ordinal()


def is_master_ordinal(local: bool = True) -> bool:
    """Whether this is replica 0 of its host (``local=True``, torch_xla's default) or of the whole run.

    Example::

        if xm.is_master_ordinal(): print("host master")
    """
    return lazyxla.runtime.is_master(local=local)


def master_print(*args, fd=sys.stdout, local: bool = False, flush: bool = False) -> None:
    """``print(*args)`` in the master replica only (the global one unless ``local=True``).

    Example::

        xm.master_print(f"epoch {epoch} done")
    """
    if is_master_ordinal(local=local):
        print(*args, file=fd, flush=flush)


# --- steps -----------------------------------------------------------------------------------------


def add_step_closure(closure: Callable, args: tuple = (), run_async: bool = False) -> None:
    """Run ``closure(*args)`` after the next step marker, when the step's tensors are computed.

    Reading tensors there (``loss.item()``) costs no extra execution. ``run_async=True`` is accepted;
    lazyxla runs every closure synchronously, in the order added.

    Example::

        xm.add_step_closure(lambda loss: print(loss.item()), args=(loss,))
    """
    with _closures_lock:
        _closures.append(lambda a=tuple(args): closure(*a))


def _run_step_closures() -> None:
    while True:
        with _closures_lock:
            if not _closures:
                return
            pending = list(_closures)
            _closures.clear()
        for fn in pending:
            fn()


def mark_step(wait: bool = False, reset_scope: bool = True) -> None:
    """End the step: compile (once) and run everything recorded since the last one, then run the step
    closures. ``wait=True`` blocks until the device has finished.

    Example::

        loss.backward(); opt.step(); xm.mark_step()
    """
    metrics.inc("mark_steps")  # torch_xla's MarkStep counter (torch_xla.debug.metrics)
    lazyxla.mark_step(wait=wait)
    _run_step_closures()


def wait_device_ops(devices: list | None = None) -> None:
    """Block until the device has computed every buffer live tensors hold.

    Example::

        xm.mark_step(); xm.wait_device_ops()      # e.g. before reading a timer
    """
    lazyxla.wait_device_ops()


def unlazy(tensors: list[torch.Tensor]) -> None:
    """Compute ``tensors`` now and wait for them (benchmarking helper).

    Example::

        xm.unlazy([loss])
    """
    lazyxla.sync(wait=True)


def get_stablehlo(tensors: list[torch.Tensor] | None = None) -> str:
    """The StableHLO text of the program that would compute ``tensors`` (``lazyxla.debug.stablehlo_text``).

    Example::

        print(xm.get_stablehlo([loss]))
    """
    if not tensors:
        unsupported("torch_xla.core.xla_model.get_stablehlo() without tensors", "lazyxla.debug.stablehlo_text(outputs)")
    return lazyxla.debug.stablehlo_text(list(tensors))


def optimization_barrier_(tensors) -> None:
    """Put ``tensors`` through one XLA optimization barrier, in place (``lazyxla.optimization_barrier_``): values
    unchanged, no computation moved across it in the program that computes them.

    Example::

        xm.optimization_barrier_([full_weight, full_bias])
    """
    lazyxla.optimization_barrier_(tensors)


# --- collectives -----------------------------------------------------------------------------------


def all_reduce(reduce_type, inputs, scale: float = 1.0, groups=None, pin_layout: bool = True):
    """Reduce ``inputs`` over the replicas with ``reduce_type`` (``xm.REDUCE_SUM``, ...) times ``scale``.

    A tensor gives a new tensor; a list is reduced in place and returned. As in torch_xla, with a single
    replica a tensor comes back as a copy and a list unchanged (``scale`` is not applied).

    Example::

        mean_loss = xm.all_reduce(xm.REDUCE_SUM, loss, scale=1.0 / xm.xrt_world_size())
    """
    op = _reduce_op(reduce_type, "all_reduce")
    if lazyxla.runtime.world_size() == 1:
        return inputs.clone() if isinstance(inputs, torch.Tensor) else inputs
    return lazyxla.all_reduce(op, inputs, scale=scale, groups=_groups(groups))


def _into(output, result):
    """torch_xla's ``output=`` of the collectives: each output tensor takes its result's data, shape and dtype
    included (torch_xla's ``*_out`` collectives replace the tensor's data, they do not copy into it), and the
    output is returned in place of the result."""
    if output is None:
        return result
    if isinstance(result, torch.Tensor):
        if not isinstance(output, torch.Tensor):
            raise TypeError(f"`output` needs to be a Tensor for a Tensor input, but given {type(output)}.")
        _take_data(output, result)
        return output
    if not isinstance(output, list) or not all(isinstance(o, torch.Tensor) for o in output):
        raise TypeError(f"`output` needs to be a list of Tensors, but given {type(output)}.")
    if len(output) != len(result):
        raise ValueError(f"`output` length doesn't match `input` length: {len(output)} vs {len(result)}")
    for o, r in zip(output, result):
        _take_data(o, r)
    return output


def _take_data(output: torch.Tensor, result: torch.Tensor) -> None:
    if not is_xla_tensor(output):
        raise TypeError(f"`output` must be a tensor on the device, not on {output.device}")
    output.data = result  # the tensor object stays, its data is the result (as torch_xla's _replace_xla_tensor)


def all_gather(value, dim: int = 0, groups=None, output=None, pin_layout: bool = True):
    """Concatenate every replica's ``value`` along ``dim`` (a list: each tensor gathered). With ``output`` (a
    tensor, or a list for a list) each output tensor takes its result's data, as in torch_xla, and is returned.

    Example::

        all_preds = xm.all_gather(preds)       # (world * n, ...)
    """
    return _into(output, lazyxla.all_gather(value, dim=dim, groups=_groups(groups)))


def all_gather_bucketized(input_list, dim=0, groups=None, output=None, pin_layout=False, bucket_cap_mb=160):
    """:func:`all_gather` of a list of tensors (lazyxla coalesces the list itself; ``bucket_cap_mb`` is ignored).

    Example::

        gathered = xm.all_gather_bucketized([a, b])
    """
    return all_gather(list(input_list), dim=dim, groups=groups, output=output)


def reduce_scatter(
    reduce_type, input, scale, scatter_dim, shard_count, groups=None, output=None, pin_layout: bool = True
):
    """Reduce ``input`` over the replicas and give replica ``i`` the ``i``-th of ``shard_count`` slices along
    ``scatter_dim``, times ``scale``. With ``output`` (a tensor, or a list for a list) each output tensor takes
    its result's data, shape included (an output shaped like the input becomes the shard), as in torch_xla.

    Example::

        shard = xm.reduce_scatter(xm.REDUCE_SUM, grad, 1.0 / n, 0, n)
    """
    op = _reduce_op(reduce_type, "reduce_scatter")
    result = lazyxla.reduce_scatter(op, input, scale, scatter_dim, shard_count, groups=_groups(groups))
    return _into(output, result)


def reduce_scatter_bucketized(
    reduce_type,
    input_list,
    scale,
    scatter_dim,
    shard_count,
    groups=None,
    output=None,
    pin_layout=False,
    bucket_cap_mb=160,
):
    """:func:`reduce_scatter` of a list of tensors (one coalesced op; ``bucket_cap_mb`` is ignored).

    Example::

        shards = xm.reduce_scatter_bucketized(xm.REDUCE_SUM, grads, 1.0, 0, n)
    """
    return reduce_scatter(reduce_type, list(input_list), scale, scatter_dim, shard_count, groups, output)


def all_to_all(value, split_dimension, concat_dimension, split_count, groups=None, pin_layout: bool = True):
    """XLA's AllToAll: split ``value`` in ``split_count`` slices along ``split_dimension``, send slice ``j``
    to replica ``j``, concatenate what arrives along ``concat_dimension``.

    Example::

        y = xm.all_to_all(x, 0, 1, xm.xrt_world_size())
    """
    return lazyxla.all_to_all(value, split_dimension, concat_dimension, split_count, groups=_groups(groups))


def collective_permute(value, pairs):
    """Send ``value`` from replica ``src`` to ``dst`` for each ``(src, dst)`` pair (others get zeros).

    Example::

        n = xm.xrt_world_size()
        y = xm.collective_permute(x, [[i, (i + 1) % n] for i in range(n)])
    """
    return lazyxla.collective_permute(value, pairs)


def collective_broadcast(tensors, root_ordinal: int = 0, groups=None, pin_layout: bool = True) -> None:
    """Overwrite ``tensors`` (a list, in place) with replica ``root_ordinal``'s values.

    Example::

        xm.collective_broadcast(list(model.parameters()))
    """
    if groups:
        unsupported("torch_xla.core.xla_model.collective_broadcast(groups=...)", "lazyxla.broadcast(tensors, root)")
    tensors = list(tensors)
    if tensors:
        lazyxla.broadcast(tensors, root=root_ordinal)


def broadcast_master_param(model: torch.nn.Module) -> None:
    """Give every replica the master's parameters and buffers, then mark the step.

    Example::

        xm.broadcast_master_param(model)
    """
    with torch.no_grad():
        collective_broadcast([*model.parameters(), *model.buffers()])
    mark_step()


def _fetch_gradients(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The gradients (``p.grad.data``) of ``optimizer``'s parameters that have one, in parameter order:
    what :func:`reduce_gradients` all-reduces. torch_xla's private helper, which accelerate calls before its
    own in-place ``xm.all_reduce`` of the gradients.

    Example::

        grads = xm._fetch_gradients(opt)
        xm.all_reduce(xm.REDUCE_SUM, grads, scale=1.0 / xr.world_size())
    """
    return [
        p.grad.data
        for group in optimizer.__getstate__()["param_groups"]
        for p in group["params"]
        if isinstance(p, torch.Tensor) and p.grad is not None
    ]


def reduce_gradients(optimizer: torch.optim.Optimizer, groups=None, pin_layout: bool = True) -> None:
    """Average the gradients of ``optimizer``'s parameters over the replicas, in place (nothing with one
    replica, or in SPMD mode, where XLA's partitioner places the reductions).

    Example::

        loss.backward(); xm.reduce_gradients(opt); opt.step()
    """
    if _spmd():
        return
    lazyxla.reduce_gradients(optimizer, groups=_groups(groups))


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    barrier: bool = False,
    optimizer_args: dict | None = None,
    groups=None,
    pin_layout: bool = True,
):
    """Average the gradients over the replicas, run ``optimizer.step(**optimizer_args)`` and return its
    result; ``barrier=True`` also marks the step (not needed under ``MpDeviceLoader``, which marks it).

    Example::

        loss.backward()
        xm.optimizer_step(opt)
    """
    reduce_gradients(optimizer, groups=groups)
    result = optimizer.step(**(optimizer_args or {}))
    if barrier:
        mark_step()
    return result


# --- host-side agreement ---------------------------------------------------------------------------


def rendezvous(tag: str, payload: bytes = b"", replicas: list | None = None) -> list[bytes]:
    """Wait until every replica reaches ``rendezvous(tag)``; returns every replica's ``payload`` by ordinal.

    Example::

        xm.rendezvous("checkpoint saved")
    """
    if replicas and sorted(replicas) != list(range(xrt_world_size())):
        raise ValueError("Only global rendezvous is supported")
    if not isinstance(payload, (bytes, bytearray)):
        raise TypeError(f"`payload` must be bytes, not {type(payload)}")
    return lazyxla.runtime.rendezvous(tag, bytes(payload))


def xla_rendezvous(payload: bytes = b"", ordinals: list | None = None, tag: str | None = None) -> list[bytes]:
    """:func:`rendezvous` with torch_xla's newer argument order.

    Example::

        payloads = xm.xla_rendezvous(b"ready", tag="start")
    """
    return rendezvous(tag or "xla_rendezvous", payload, ordinals)


def _device_tensors(data) -> list[torch.Tensor]:
    """The lazyxla tensors in nested dicts, lists and tuples, each once."""
    found: dict[int, torch.Tensor] = {}
    map_tensors(data, lambda t: found.setdefault(id(t), t) if on_device(t) else t)
    return list(found.values())


def _maybe_convert_to_cpu(data, convert: bool = True):
    """Compute the lazyxla tensors in ``data`` (nested dicts, lists, tuples) in one program and, with
    ``convert``, return ``data`` with each of them replaced by its CPU copy (containers keep their type; a
    tensor found twice gives one CPU tensor, so aliasing survives). ``convert=False`` only computes them and
    returns ``data`` itself: the replicas that do not write a checkpoint run the same program as the one that
    does. torch_xla's private helper, which accelerate (``accelerate.utils.save``) and transformers (TPU
    checkpoints) call.

    Example::

        cpu_state = xm._maybe_convert_to_cpu(model.state_dict())
        torch.save(cpu_state, "model.pt")
    """
    found = _device_tensors(data)
    pending = [unwrap(t) for t in found]
    if pending:
        graph.sync_tensors(pending, reason="xm._maybe_convert_to_cpu")
    if not convert:
        return data
    copies = {id(t): t.detach().cpu() for t in found}
    return map_tensors(data, lambda t: copies.get(id(t), t))


def mesh_reduce(tag: str, data, reduce_fn: Callable):
    """Gather ``data`` (what :func:`lazyxla.runtime.mesh_reduce` sends: scalars, strings, bytes, lists, tuples,
    dicts, NumPy arrays, tensors; device tensors are moved to the CPU) from every replica and
    return ``reduce_fn(list_of_values)``.

    Example::

        acc = xm.mesh_reduce("test_accuracy", accuracy, np.mean)
    """
    return lazyxla.runtime.mesh_reduce(tag, _maybe_convert_to_cpu(data), reduce_fn)


def do_on_ordinals(target: Callable, data=(), ordinals=(0,)):
    """Run ``target(*data)`` (device tensors moved to the CPU) on the given ordinals only, then meet the
    other replicas; returns the result there, None elsewhere.

    Example::

        xm.do_on_ordinals(write_report, (metrics,))
    """
    running = get_ordinal() in ordinals
    cpu_data = _maybe_convert_to_cpu(data, convert=running)
    result = target(*cpu_data) if running else None
    rendezvous("torch_xla.core.xla_model.do_on_ordinals")
    return result


def save(data, file_or_path, master_only: bool = True, global_master: bool = False) -> None:
    """``torch.save`` of ``data`` with device tensors moved to the CPU first.

    With ``master_only`` (default) only the master writes: each host's local master, or with
    ``global_master=True`` only replica 0. Every replica computes the tensors (the same program), as in
    torch_xla. A path is written atomically (the old file or the whole new one, never a part). There is no
    barrier, as in torch_xla.

    Example::

        xm.save(model.state_dict(), "model.pt")
    """
    writes = not master_only or is_master_ordinal(local=not global_master)
    if writes and isinstance(file_or_path, (str, os.PathLike)):
        require_parent_folder(file_or_path, "xm.save")  # torch.save's error, as torch_xla's xm.save raises it
    cpu = _maybe_convert_to_cpu(data, convert=writes)
    if not writes:
        return
    if isinstance(file_or_path, (str, os.PathLike)):
        buffer = io.BytesIO()
        torch.save(cpu, buffer)
        atomic_write(file_or_path, buffer.getvalue())
    else:
        torch.save(cpu, file_or_path)


def send_cpu_data_to_device(datas, device, input_sharding=None):
    """Every CPU tensor in ``datas`` (nested lists, tuples, dicts) moved to ``device``; a single tensor
    comes back in a list, as in torch_xla.

    Example::

        (x,) = xm.send_cpu_data_to_device(x_cpu, xm.xla_device())
    """
    if isinstance(datas, torch.Tensor):
        datas = [datas]
    out = map_tensors(datas, lambda t: t.to(device) if t.device.type == "cpu" else t)
    if input_sharding is not None:
        out = map_tensors(out, input_sharding._annotate)
    return out


# --- RNG and memory --------------------------------------------------------------------------------


def set_rng_state(seed: int, device=None) -> None:
    """Seed the device RNG; a value :func:`get_rng_state` returned restores that exact state.

    Example::

        xm.set_rng_state(1234)
    """
    seed = int(seed)
    rng.set_state((seed & 0xFFFFFFFFFFFFFFFF, seed >> 64 if seed > 0 else 0))


def get_rng_state(device=None) -> int:
    """The device RNG's state as one integer (seed plus how far the stream has advanced).

    Example::

        state = xm.get_rng_state(); ...; xm.set_rng_state(state)
    """
    seed, counter = rng.get_state()
    return (int(counter) << 64) | int(seed)


@contextlib.contextmanager
def fork_rng(device=None, enabled: bool = True):
    """Restore the device RNG's state when the block ends.

    Example::

        with xm.fork_rng():
            noise = torch.randn(4, device=dev)
    """
    if not enabled:
        yield
        return
    state = get_rng_state(device)
    try:
        yield
    finally:
        set_rng_state(state, device)


def get_memory_info(device=None) -> dict:
    """Device memory use as ``{'bytes_used', 'bytes_limit', 'peak_bytes_used'}`` (jax's
    ``Device.memory_stats()``); the CPU backend reports none (NotImplementedError).

    Example::

        info = xm.get_memory_info(); print(info["bytes_used"] / info["bytes_limit"])
    """
    index = torch.device(device).index if device is not None else None
    stats = devices.jax_device(index).memory_stats()
    if not stats:
        unsupported(
            f"torch_xla.core.xla_model.get_memory_info on the {platform_name()} backend (it reports no memory "
            "statistics)",
            "jax.local_devices()[0].memory_stats() on a GPU or TPU",
        )
    return {
        "bytes_used": int(stats.get("bytes_in_use", 0)),
        "bytes_limit": int(stats.get("bytes_limit", 0)),
        "peak_bytes_used": int(stats.get("peak_bytes_in_use", 0)),
    }


# --- progress --------------------------------------------------------------------------------------


class RateTracker:
    """Samples per second, smoothed (``rate()``) and since creation (``global_rate()``).

    Example::

        tracker = xm.RateTracker()
        tracker.add(batch_size); print(tracker.rate(), tracker.global_rate())
    """

    def __init__(self, smooth_factor: float | None = None) -> None:
        self._smooth_factor = 0.4 if smooth_factor is None else smooth_factor
        self._start_time = time.time()
        self._partial_time = self._start_time
        self._partial_count = 0.0
        self._partial_rate: float | None = None
        self._count = 0.0

    def add(self, count: float) -> None:
        self._count += count

    def rate(self) -> float:
        now = time.time()
        delta = now - self._partial_time
        if delta <= 0:
            return 0.0
        current = self._count / delta
        if self._partial_rate is not None:
            current = (1 - self._smooth_factor) * current + self._smooth_factor * self._partial_rate
        self._partial_count += self._count
        self._count = 0.0
        self._partial_time = now
        self._partial_rate = current
        return current

    def global_rate(self) -> float:
        delta = time.time() - self._start_time
        return (self._partial_count + self._count) / delta if delta > 0 else 0.0


# --- not supported ---------------------------------------------------------------------------------

send = stub("torch_xla.core.xla_model.send", "lazyxla.collective_permute(value, pairs)")
recv = stub("torch_xla.core.xla_model.recv", "lazyxla.collective_permute(value, pairs)")
get_stablehlo_bytecode = stub(
    "torch_xla.core.xla_model.get_stablehlo_bytecode", "lazyxla.export(fn, args) for a serialized StableHLO artifact"
)


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
