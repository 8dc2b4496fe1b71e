"""``torch_xla._internal.rendezvous``: the handler of torch.distributed's ``xla://`` init method.

``pjrt_rendezvous_handler`` is what ``dist.init_process_group("xla", init_method="xla://")`` calls (registered
by ``torch_xla.distributed.xla_backend``): it yields ``(store, rank, world_size)`` with the rank and world size
of lazyxla's runtime (the replica's ordinal and the replica count) and the store at ``MASTER_ADDR``/``MASTER_PORT``
(set by ``xmp.spawn`` and torchrun); a run of one replica without them gets an in-memory store.
``DummyStore`` is torch_xla's store that holds nothing.

Example::

    from torch_xla._internal import rendezvous
    store, rank, world_size = next(rendezvous.pjrt_rendezvous_handler("xla://"))
"""

from __future__ import annotations

import torch.distributed as dist

from lazyxla.compat._common import missing_attribute
from lazyxla.compat.torch_xla.distributed import xla_backend


class DummyStore(dist.Store):
    """A store that holds nothing: torch_xla's, for process groups that use their store only as a barrier.

    Example::

        store = rendezvous.DummyStore()
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()


def pjrt_rendezvous_handler(url: str, timeout=None, **kwargs):
    """Yield ``(store, rank, world_size)`` for ``url`` (``xla://``), as the ``xla://`` init method does.

    Example::

        store, rank, world_size = next(pjrt_rendezvous_handler("xla://"))
    """
    yield from xla_backend.rendezvous_handler(url, timeout, **kwargs)


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
