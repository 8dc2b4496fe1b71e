"""``torch_xla.distributed.xla_backend`` on lazyxla: the ``"xla"`` torch.distributed backend and the
``xla://`` init method.

Importing it registers backend ``"xla"`` as lazyxla's process group (the same as ``"lazyxla"``: its
collectives on device tensors are recorded into the step's program, so ``DistributedDataParallel``
works) and the ``xla://`` rendezvous, which takes the rank and world size from the runtime and the
store address from ``MASTER_ADDR``/``MASTER_PORT`` (set by ``xmp.spawn`` and torchrun).

Example::

    import torch.distributed as dist
    import torch_xla.distributed.xla_backend  # noqa: F401
    dist.init_process_group("xla", init_method="xla://")
    model = DDP(model.to(xm.xla_device()), gradient_as_bucket_view=True)
"""

from __future__ import annotations

import importlib
import urllib.parse

import torch.distributed as dist

import lazyxla
from lazyxla import torch_private
from lazyxla.compat._common import missing_attribute
from lazyxla.config import foreign_env
from lazyxla.device.devices import torch_name
from lazyxla.parallel import process_group as _process_group

# the module (torch.distributed.rendezvous is also the name of a function there)
_rendezvous = importlib.import_module("torch.distributed.rendezvous")


def _xla_rendezvous_handler(url: str, timeout=None, **kwargs):
    rank, world = lazyxla.runtime.global_ordinal(), lazyxla.runtime.world_size()
    if world == 1 and not (foreign_env("MASTER_ADDR") and foreign_env("MASTER_PORT")):
        yield (dist.HashStore(), 0, 1)
        return
    query = urllib.parse.urlencode({"rank": rank, "world_size": world})
    env_kwargs = {} if timeout is None else {"timeout": timeout}
    yield from _rendezvous.rendezvous(f"env://?{query}", **env_kwargs)


def _create(*args, **kwargs):
    """lazyxla's process group, for backend ``"xla"``; as in torch_xla, not in SPMD mode (one process drives
    every device there: shardings, not replica collectives, say how values move)."""
    if lazyxla.spmd.is_enabled():
        raise AssertionError("the XLA backend of torch.distributed is not supported in SPMD mode")
    return _process_group._create(*args, **kwargs)


def _register() -> None:
    if "xla" not in dist.Backend.backend_list:
        dist.Backend.register_backend("xla", _create, devices=[torch_name()])
    if not torch_private.has_rendezvous_handler("xla"):
        _rendezvous.register_rendezvous_handler("xla", _xla_rendezvous_handler)


_register()


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
