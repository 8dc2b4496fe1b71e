"""``torch_xla._internal.tpu``: what a host's TPU hardware is, and how many XLA devices its processes drive.

The hardware questions read the host as torch_xla does: ``num_available_chips()`` counts the Google TPU chips on
the PCI bus (0 on a host without TPUs), ``get_tpu_env()`` reads the TPU VM's metadata (from the
``TPU_SKIP_MDS_QUERY`` variables, or the metadata server on a host that has TPU chips; elsewhere it raises, as
torch_xla's does off a TPU VM, without waiting on a server that is not there), ``configure_topology`` sets the
TPU runtime's process variables from that metadata, as torch_xla's.

Two deliberate differences: ``num_available_devices()`` (what Lightning's ``accelerator="tpu"``/``"auto"``
asks, and what makes it choose the XLA path) answers the XLA devices a process group on this host can drive.
torch_xla answers 0 off a TPU host because its XLA devices need TPU chips there; lazyxla's device exists on any
host, so off a TPU host the answer is the count ``xmp.spawn(nprocs=None)`` starts (``CPU_NUM_DEVICES`` /
``GPU_NUM_DEVICES`` / ``TPU_NUM_DEVICES``, else 1). And off a TPU host ``get_worker_ips()`` answers one worker,
``['localhost']`` (torch_xla's raises there, having no metadata server to ask): the host's lazyxla devices are
the whole slice, so ``num_expected_global_devices()`` is ``num_available_devices()``.

Example::

    from torch_xla._internal import tpu
    tpu.num_available_chips()       # 0 on a CPU host
    tpu.num_available_devices()     # 1 on a CPU host (2 with CPU_NUM_DEVICES=2)
"""

from __future__ import annotations

import functools
import glob
import operator
import os
import pathlib
import re
import urllib.request
from typing import NamedTuple

import lazyxla
from lazyxla.compat._common import missing_attribute
from lazyxla.compat.torch_xla.core import xla_env_vars as xenv
from lazyxla.compat.torch_xla.distributed.xla_multiprocessing import default_nprocs
from lazyxla.compat.torch_xla.utils import utils as xu

_GCE_METADATA_ROOT_URL = "http://metadata.google.internal/computeMetadata/v1"
_GOOGLE_PCI_VENDOR_ID = "0x1ae0"
# torch_xla's table: v2/v3, v4, v5e, v6e, two test parts, 7x
_TPU_PCI_DEVICE_IDS = ("0x0027", "0x005e", "0x0063", "0x006f", "0x0056", "0x0062", "0x0076")
# the host bounds of v2 and v3 slices, which their metadata lacks (torch_xla's table)
_ACCELERATOR_TYPE_TO_HOST_BOUNDS = {
    "v2-8": "1,1,1",
    "v2-32": "2,2,1",
    "v2-128": "4,4,1",
    "v2-256": "4,8,1",
    "v2-512": "8,8,1",
    "v3-8": "1,1,1",
    "v3-32": "2,2,1",
    "v3-64": "2,4,1",
    "v3-128": "4,4,1",
    "v3-256": "4,8,1",
    "v3-512": "8,8,1",
    "v3-1024": "8,16,1",
    "v3-2048": "16,16,1",
}
_PCI_DEVICES = "/sys/bus/pci/devices"


class MeshShape(NamedTuple):
    """A TPU mesh shape such as ``'2,2,1'``.

    Example::

        assert MeshShape.from_string("2,2,1").size == 4
    """

    x: int
    y: int
    z: int

    @classmethod
    def from_string(cls, mesh: str) -> MeshShape:
        dims = tuple(int(d) for d in mesh.split(","))
        if len(dims) != 3:
            raise ValueError(f"Mesh shape '{mesh}' should be length 3")
        return cls(*dims)

    @property
    def size(self) -> int:
        return functools.reduce(operator.mul, self)

    def __mul__(self, other):
        return MeshShape(*(a * b for a, b in zip(self, other)))


def process_bounds_size() -> int | None:
    """Processes across all TPU hosts (``TPU_PROCESS_BOUNDS``), or None when unknown.

    Example::

        n = tpu.process_bounds_size()
    """
    bounds = xu.getenv_as(xenv.TPU_PROCESS_BOUNDS, str)
    return MeshShape.from_string(bounds).size if bounds else None


def num_available_chips() -> int:
    """The Google TPU chips attached to this host through PCI (0 on a host without TPUs).

    Example::

        if tpu.num_available_chips() == 0: print("not a TPU host")
    """
    chips = 0
    for vendor_path in glob.glob(os.path.join(_PCI_DEVICES, "*", "vendor")):
        if pathlib.Path(vendor_path).read_text().strip() != _GOOGLE_PCI_VENDOR_ID:
            continue
        device_id = pathlib.Path(os.path.dirname(vendor_path), "device").read_text().strip()
        chips += device_id in _TPU_PCI_DEVICE_IDS
    return chips


def num_logical_cores_per_chip() -> int:
    """XLA devices per TPU chip: 2 on v2/v3, else 1 (reads the TPU generation, see :func:`version`).

    Example::

        cores = tpu.num_logical_cores_per_chip()
    """
    return 2 if version() <= 3 else 1


def num_available_devices() -> int:
    """The XLA devices a process group on this host can drive; safe before ``xmp.spawn`` (starts nothing).

    With TPU chips: chips x cores per chip, as torch_xla. Without: lazyxla's device still exists, and the
    answer is what ``xmp.spawn(nprocs=None)`` starts (``CPU_NUM_DEVICES`` etc., else 1); torch_xla answers 0
    there (see the module's note).

    Example::

        Trainer(accelerator="tpu", devices=tpu.num_available_devices())
    """
    chips = num_available_chips()
    return chips * num_logical_cores_per_chip() if chips else default_nprocs()[0]


def num_expected_global_devices() -> int:
    """XLA devices across the TPU slice: this host's times the workers.

    Example::

        n = tpu.num_expected_global_devices()
    """
    return num_available_devices() * num_tpu_workers()


def num_local_processes() -> int:
    """Processes to start on this host: one per TPU chip (capped by ``TPU_PROCESS_BOUNDS``), or off a TPU host
    the count ``xmp.spawn(nprocs=None)`` starts.

    Example::

        n = tpu.num_local_processes()
    """
    chips = num_available_chips()
    if not chips:
        return default_nprocs()[0]
    total = process_bounds_size()
    return min(chips, total) if total else chips


def task_id() -> int | None:
    """This process's index among the TPU worker processes (``CLOUD_TPU_TASK_ID``), if set.

    Example::

        rank = tpu.task_id()
    """
    return xu.getenv_as(xenv.CLOUD_TPU_TASK_ID, int)


def _using_env_vars() -> bool:
    return bool(xu.getenv_as(xenv.TPU_SKIP_MDS_QUERY, str, False))


def build_tpu_env_from_vars() -> dict:
    """The TPU environment from ``TPU_ACCELERATOR_TYPE``, ``TPU_PROCESS_BOUNDS``, ... (as torch_xla).

    Example::

        env = tpu.build_tpu_env_from_vars()     # {'ACCELERATOR_TYPE': 'v4-8', ...}
    """
    return {
        xenv.ACCELERATOR_TYPE: xu.getenv_as(xenv.TPU_ACCELERATOR_TYPE, str),
        xenv.TPU_PROCESS_BOUNDS: xu.getenv_as(xenv.TPU_PROCESS_BOUNDS, str, xu.getenv_as(xenv.TPU_HOST_BOUNDS, str)),
        xenv.TPU_CHIPS_PER_PROCESS_BOUNDS: xu.getenv_as(
            xenv.TPU_CHIPS_PER_PROCESS_BOUNDS, str, xu.getenv_as(xenv.TPU_CHIPS_PER_HOST_BOUNDS, str)
        ),
        xenv.WORKER_ID: xu.getenv_as(xenv.CLOUD_TPU_TASK_ID, str, xu.getenv_as(xenv.TPU_WORKER_ID, str)),
    }


class NotATpuHostError(OSError):
    """The TPU VM metadata was asked for on a host without TPU chips (no metadata server to ask).

    Example::

        try:
            tpu.get_tpu_env()
        except tpu.NotATpuHostError:   # an OSError, as torch_xla's failed request
            ...                        # not a TPU VM: describe one with TPU_SKIP_MDS_QUERY=1 and TPU_ACCELERATOR_TYPE
    """


def _get_metadata(key: str) -> str:
    """The TPU VM's metadata attribute ``key``; :class:`NotATpuHostError` on a host without TPU chips, where
    torch_xla's request fails too (after trying the server)."""
    if not num_available_chips():
        raise NotATpuHostError(
            "Failed to get TPU metadata: this host has no TPU chips on its PCI bus (not a TPU VM); set "
            "TPU_SKIP_MDS_QUERY=1 and TPU_ACCELERATOR_TYPE (e.g. v4-8) to describe one"
        )
    request = urllib.request.Request(
        f"{_GCE_METADATA_ROOT_URL}/instance/attributes/{key}", headers={"Metadata-Flavor": "Google"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


def _parse_tpu_env(text: str) -> dict:
    """The ``tpu-env`` metadata: one ``KEY: 'value'`` per line."""
    env = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            env[key.strip()] = value.strip().strip("'\"")
    return env


def get_tpu_env() -> dict:
    """The TPU VM's environment (``ACCELERATOR_TYPE``, ``TPU_PROCESS_BOUNDS``, ``WORKER_ID``, ...).

    From the variables when ``TPU_SKIP_MDS_QUERY`` is set, else from the TPU VM's metadata server. A host
    without TPU chips has no TPU environment: ``OSError`` (torch_xla's fails there too, querying a
    metadata server that does not answer).

    Example::

        accelerator = tpu.get_tpu_env()["ACCELERATOR_TYPE"]      # 'v4-8'
    """
    if _using_env_vars():
        return build_tpu_env_from_vars()
    try:
        return _parse_tpu_env(_get_metadata("tpu-env"))
    except NotATpuHostError:
        raise
    except OSError as e:
        raise OSError("Failed to get TPU metadata") from e


def worker_id() -> int:
    """This TPU worker's ID (``WORKER_ID`` of :func:`get_tpu_env`).

    Example::

        wid = tpu.worker_id()
    """
    return int(get_tpu_env()[xenv.WORKER_ID])


def version() -> int:
    """The TPU generation (4 for ``v4-8``, 7 for ``tpu7x-8``) from :func:`get_tpu_env`; ``OSError`` when the
    accelerator type is not a TPU's.

    Example::

        if tpu.version() >= 4: ...
    """
    accelerator = get_tpu_env()[xenv.ACCELERATOR_TYPE]
    match = re.match(r"^(?:v|tpu)(\d)([A-Za-z]?){7}-(\d+)$", accelerator or "")
    if not match:
        raise OSError(f"Failed to parse TPU version from metadata: accelerator type {accelerator!r}")
    return int(match.groups()[0])


def get_tpu_type() -> str:
    """The TPU type (``'v6e'`` for ``v6e-8``).

    Example::

        kind = tpu.get_tpu_type()
    """
    accelerator = get_tpu_env()[xenv.ACCELERATOR_TYPE]
    match = re.search(r"^([^-]*)-", accelerator)
    return match.group(1) if match else accelerator


def get_worker_ips() -> list[str]:
    """The TPU workers' addresses in order; ``['localhost']`` for one host (or off a TPU host).

    Example::

        ips = tpu.get_worker_ips()
    """
    if _using_env_vars():
        hosts = xu.getenv_as(xenv.TPU_WORKER_HOSTNAMES, str, "").split(",")
    else:
        try:
            endpoints = _get_metadata("worker-network-endpoints")
        except NotATpuHostError:  # lazyxla's devices on this host are the whole slice (the module's note)
            return ["localhost"]
        hosts = [w.split(":")[2] for w in endpoints.split(",")]  # 'hostname:uid:ip,...'
    return hosts if len(hosts) > 1 else ["localhost"]


def num_tpu_workers() -> int:
    """How many TPU hosts (workers) the slice has.

    Example::

        n = tpu.num_tpu_workers()
    """
    return len(get_worker_ips())


def configure_one_chip_topology() -> None:
    """Set the TPU topology variables for one process on one chip (kept when already set).

    Example::

        tpu.configure_one_chip_topology()
    """
    os.environ.setdefault(xenv.TPU_VISIBLE_CHIPS, "0")
    os.environ.setdefault(xenv.TPU_CHIPS_PER_PROCESS_BOUNDS, "1,1,1")
    os.environ.setdefault(xenv.TPU_PROCESS_BOUNDS, "1,1,1")


def configure_topology(local_rank: int, local_world_size: int, base_port: int = 8476) -> None:
    """Set the TPU runtime's variables for process ``local_rank`` of ``local_world_size`` on this host, one chip
    per process, from the TPU metadata (kept when already set), as torch_xla: process bounds, task id, the
    processes' addresses (ports ``base_port`` onward on every worker), visible chip and port.

    Example::

        tpu.configure_topology(local_rank=0, local_world_size=4)   # TPU_VISIBLE_CHIPS=0, TPU_PROCESS_PORT=8476
    """
    tpu_env = get_tpu_env()
    tpu_version = version()
    if tpu_version >= 4:
        default_bounds = MeshShape.from_string(tpu_env[xenv.TPU_PROCESS_BOUNDS])
        chips_per_process = MeshShape.from_string(tpu_env[xenv.TPU_CHIPS_PER_PROCESS_BOUNDS])
    else:  # v2/v3 metadata has no bounds: torch_xla's table
        default_bounds = MeshShape.from_string(_ACCELERATOR_TYPE_TO_HOST_BOUNDS[tpu_env[xenv.ACCELERATOR_TYPE]])
        chips_per_process = MeshShape.from_string("2,2,1")
    process_bounds = ",".join(str(d) for d in default_bounds * chips_per_process)  # one chip per process
    if tpu_version == 7:
        process_bounds += ",2"
    os.environ.setdefault(xenv.TPU_CHIPS_PER_PROCESS_BOUNDS, "1,1,1")
    os.environ.setdefault(xenv.TPU_PROCESS_BOUNDS, process_bounds)
    worker = int(tpu_env[xenv.WORKER_ID])
    os.environ.setdefault(xenv.CLOUD_TPU_TASK_ID, str(worker * local_world_size + local_rank))
    ports = list(range(base_port, base_port + local_world_size))
    endpoints = [",".join(f"{ip}:{port}" for port in ports) for ip in get_worker_ips()]
    os.environ.setdefault(xenv.TPU_PROCESS_ADDRESSES, ",".join(endpoints))
    os.environ.setdefault(xenv.TPU_VISIBLE_CHIPS, str(local_rank))
    os.environ.setdefault(xenv.TPU_PROCESS_PORT, str(ports[local_rank]))


def discover_master_worker_ip(use_localhost: bool = True) -> str:
    """The address of the master TPU host: ``'localhost'`` for one host; else the host running replica 0 (process
    0 in SPMD mode), as torch_xla. Every process must call it (it meets the others: lazyxla's process 0 runs
    replica 0, so its worker id names the host, where torch_xla broadcasts it from device 0).

    Example::

        os.environ.setdefault("MASTER_ADDR", tpu.discover_master_worker_ip())
    """
    worker_ips = get_worker_ips()
    if len(worker_ips) == 1:
        return "localhost"
    current = str(int(get_tpu_env()[xenv.WORKER_ID])).encode()
    worker_ids = lazyxla.runtime.rendezvous("torch_xla._internal.tpu.discover_master_worker_ip", current)
    return worker_ips[int(worker_ids[0])]


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
