"""``torch_xla._internal.gpu``: how many processes a GPU host starts (torch_xla 2.8 and earlier had this module).

``num_local_processes()`` reads ``GPU_NUM_DEVICES`` (it must be set, as in torch_xla) and records it as the
host's ``LOCAL_WORLD_SIZE``. On lazyxla one process drives one device, as in torch_xla's GPU runtime, so
``xmp.spawn(nprocs=None)`` starts that many replicas on a CUDA host.

Example::

    os.environ["GPU_NUM_DEVICES"] = "2"
    from torch_xla._internal import gpu
    assert gpu.num_local_processes() == 2
"""

from __future__ import annotations

import os

from lazyxla.compat._common import missing_attribute
from lazyxla.compat.torch_xla.core import xla_env_vars as xenv


def num_local_processes() -> int:
    """The processes to start on this host: ``GPU_NUM_DEVICES`` (``AssertionError`` when unset, as torch_xla),
    also set as ``LOCAL_WORLD_SIZE``.

    Example::

        n = gpu.num_local_processes()
    """
    assert xenv.GPU_NUM_DEVICES in os.environ, (
        "Must set `GPU_NUM_DEVICES` environment variable to use the PjRt GPU client"
    )
    os.environ[xenv.LOCAL_WORLD_SIZE] = os.environ[xenv.GPU_NUM_DEVICES]
    return int(os.environ[xenv.LOCAL_WORLD_SIZE])


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
