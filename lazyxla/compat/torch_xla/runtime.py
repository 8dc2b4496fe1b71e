"""``torch_xla.runtime`` (``xr``) on lazyxla: the run's devices, processes and SPMD mode.

lazyxla has one runtime, jax's (PJRT underneath, as torch_xla's current runtime): ``using_pjrt()`` is
always True. One replica is one process; ``world_size()``/``global_ordinal()`` count processes.

Example::

    import torch_xla.runtime as xr
    xr.use_spmd()
    n = xr.global_runtime_device_count()
    print(xr.device_type(), n, xr.world_size(), xr.global_ordinal())
"""

from __future__ import annotations

import os

import jax

import lazyxla
from lazyxla.compat._common import missing_attribute, platform_name, stub, unsupported
from lazyxla.compat.torch_xla.debug import metrics as met
from lazyxla.config import foreign_env
from lazyxla.device.processes import _backend_started


def device_type() -> str:
    """The hardware lazyxla runs on: ``'CPU'``, ``'CUDA'`` or ``'TPU'`` (jax's platform).

    Example::

        if xr.device_type() == "TPU": ...
    """
    return platform_name()


def set_device_type(pjrt_device: str) -> None:
    """Choose the platform before any device is used (``'CPU'``, ``'CUDA'``/``'GPU'``, ``'TPU'``): sets
    jax's ``jax_platforms``. Changing it after jax started raises, as in torch_xla.

    Example::

        xr.set_device_type("CPU")
    """
    platform = {"CPU": "cpu", "CUDA": "cuda", "GPU": "cuda", "TPU": "tpu"}.get(pjrt_device.upper())
    if platform is None:
        unsupported(f"torch_xla.runtime.set_device_type({pjrt_device!r})", "JAX_PLATFORMS=<platform> for jax")
    if _backend_started():
        if platform_name() != {"cpu": "CPU", "cuda": "CUDA", "tpu": "TPU"}[platform]:
            raise RuntimeError("Can't change device type after XLA runtime is initialized")
        return
    jax.config.update("jax_platforms", platform)


def using_pjrt() -> bool:
    """Always True: lazyxla runs on jax's PJRT runtime (there is no XRT).

    Example::

        assert xr.using_pjrt()
    """
    return True


def is_bf16_supported() -> bool:
    """Whether bfloat16 tensors work on the device (always, through XLA).

    Example::

        dtype = torch.bfloat16 if xr.is_bf16_supported() else torch.float32
    """
    return True


def world_size() -> int:
    """Replicas (processes) taking part in the run.

    Example::

        sampler = DistributedSampler(ds, num_replicas=xr.world_size(), rank=xr.global_ordinal())
    """
    return lazyxla.runtime.world_size()


def global_ordinal() -> int:
    """This replica's index among all replicas.

    Example::

        if xr.global_ordinal() == 0: print("master")
    """
    return lazyxla.runtime.global_ordinal()


def local_ordinal() -> int:
    """This replica's index among the replicas of its host.

    Example::

        print(xr.local_ordinal())
    """
    return lazyxla.runtime.local_ordinal()


def process_index() -> int:
    """This process's index in the run.

    Example::

        print(xr.process_index())
    """
    return lazyxla.runtime.process_index()


def process_count() -> int:
    """Processes in the run.

    Example::

        print(xr.process_count())
    """
    return lazyxla.runtime.process_count()


def host_index() -> int:
    """This host's index: the process index (lazyxla runs one process per host in SPMD runs).

    Example::

        print(xr.host_index())
    """
    return lazyxla.runtime.process_index()


def local_process_count() -> int:
    """Processes on this host (the launcher's ``LOCAL_WORLD_SIZE``, else every process of the run).

    Example::

        print(xr.local_process_count())
    """
    local = foreign_env("LOCAL_WORLD_SIZE")
    return int(local) if local.isdigit() else lazyxla.runtime.process_count()


def addressable_device_count() -> int:
    """Devices this process drives.

    Example::

        print(xr.addressable_device_count())
    """
    return len(lazyxla.devices())


addressable_runtime_device_count = addressable_device_count


def local_device_count() -> int:
    """Devices on this host (processes on the host times devices per process).

    Example::

        print(xr.local_device_count())
    """
    return local_process_count() * addressable_device_count()


def global_device_count() -> int:
    """Devices of the whole run, every process included.

    Example::

        print(xr.global_device_count())
    """
    return lazyxla.spmd.device_count()


def global_runtime_device_count() -> int:
    """Devices of the whole run (what an SPMD mesh spans).

    Example::

        n = xr.global_runtime_device_count()
        mesh = xs.Mesh(np.arange(n), (n, 1), ("data", "model"))
    """
    return lazyxla.spmd.device_count()


def use_spmd(auto: bool = False) -> None:
    """Turn SPMD mode on (``lazyxla.spmd.enable()``): the device stands for every device of the run and
    ``xs.mark_sharding`` annotations drive XLA's partitioner. Call it before any tensor is on the device
    (lazyxla raises otherwise; torch_xla would replicate the existing tensors). Sets ``XLA_USE_SPMD=1`` in the
    environment, as torch_xla does.

    ``auto=True``: torch_xla's auto-sharding mode (``XLA_AUTO_SPMD=1``, ``_XLAC._xla_get_auto_sharding()``, the
    counter ``CompileWithAutoSharding``). torch_xla has XLA choose every layout with its auto-sharding pass; jax has
    no public way to ask for that pass, and the XLA CPU compiler of jaxlib 0.10 accepts the option and leaves every
    value replicated. So in lazyxla the mode applies a fixed policy where torch_xla applies the pass: a module given to
    ``xs.xla_distribute_module(module, mesh, auto_policy)`` has each parameter split over all devices on its first
    dimension they divide (``lazyxla.spmd.fsdp`` over a 1-D mesh), and XLA's partitioner propagates the layouts
    to the rest; tensors nothing annotates stay replicated (docs/migrating-from-torch_xla.md, "Auto-sharding").

    Example::

        xr.use_spmd()
        model = Net().to(xm.xla_device())
    """
    try:
        lazyxla.spmd.enable()
    except RuntimeError as e:
        raise RuntimeError(f"torch_xla.runtime.use_spmd: {e}") from None
    os.environ["XLA_USE_SPMD"] = "1"  # as torch_xla does: scripts read it (lazyxla itself does not)
    if auto:
        met.auto_sharding_began()
        os.environ["XLA_AUTO_SPMD"] = "1"


def is_spmd() -> bool:
    """Whether SPMD mode is on.

    Example::

        if xr.is_spmd(): ...
    """
    return lazyxla.spmd.is_enabled()


def initialize_cache(path: str, readonly: bool = False) -> None:
    """Keep compiled programs on disk in ``path`` (``lazyxla.config.cache_dir``, ``persistent_cache``).
    ``readonly=True`` is not supported.

    Example::

        xr.initialize_cache("/tmp/xla_cache")
    """
    if readonly:
        unsupported("torch_xla.runtime.initialize_cache(readonly=True)", "lazyxla.config.cache_dir (read-write)")
    lazyxla.config.cache_dir = os.fspath(path)
    lazyxla.config.persistent_cache = True


get_master_ip = stub("torch_xla.runtime.get_master_ip", "lazyxla.config.coordinator_address / MASTER_ADDR")
runtime_device_attributes = stub("torch_xla.runtime.runtime_device_attributes", "jax.devices() and their attributes")
global_runtime_device_attributes = stub(
    "torch_xla.runtime.global_runtime_device_attributes", "jax.devices() and their attributes"
)


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
