"""``torch_xla._XLAC`` on lazyxla: the bindings of torch_xla's C++ module that libraries and torch_xla's public
tests call: ``_xla_get_tensor_id``, ``_get_xla_sharding_spec``, ``_ensure_xla_coordinator_initialized``,
``_xla_get_auto_sharding`` and ``_xla_set_mat_mul_precision``/``_xla_get_mat_mul_precision`` (over
``lazyxla.config.matmul_precision``).

transformers' ``id_tensor_storage`` (``save_pretrained``'s search for tied weights) and peft's equivalent ask it
for a tensor whose ``device.type`` is ``"xla"``, because XLA tensors have no storage pointer. Every other name
of torch_xla's C++ module raises ``AttributeError``.

Example::

    import torch_xla
    a, b = w.detach(), w.detach()
    assert torch_xla._XLAC._xla_get_tensor_id(a) == torch_xla._XLAC._xla_get_tensor_id(b)
"""

from __future__ import annotations

import torch

import lazyxla
from lazyxla import torch_private
from lazyxla.compat._common import missing_attribute
from lazyxla.compat.torch_xla.debug import metrics as met
from lazyxla.device import processes
from lazyxla.device.devices import on_device


def _xla_get_tensor_id(tensor: torch.Tensor) -> int:
    """A number that identifies the device data ``tensor`` shares with its views (``detach()``, slices,
    transposes, a tied parameter's other names), the same for as long as that data lives; tensors that do not
    share it (a ``clone()`` included) get different numbers. It stands for the storage pointer device tensors do
    not have, which is what transformers uses it for.

    Example::

        torch_xla._XLAC._xla_get_tensor_id(model.lm_head.weight.detach())
    """
    if not isinstance(tensor, torch.Tensor) or not on_device(tensor):
        where = tensor.device if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise RuntimeError(f"torch_xla._XLAC._xla_get_tensor_id: expected a tensor on the XLA device, got {where}")
    return torch_private.storage_id(tensor)


def _get_xla_sharding_spec(tensor: torch.Tensor) -> str:
    """The HLO sharding text of ``tensor``'s SPMD annotation (``''`` without one), as torch_xla users read it to
    check a layout: ``torch_xla.distributed.spmd.debugging.construct_v1_sharding_str``.

    Example::

        xs.mark_sharding(t, mesh, ("data", None))
        print(torch_xla._XLAC._get_xla_sharding_spec(t))     # {devices=[4,1]0,1,2,3}
    """
    from lazyxla.compat.torch_xla.distributed.spmd import debugging  # loads rich: only when a sharding is asked for

    return debugging.construct_v1_sharding_str(tensor)


def _ensure_xla_coordinator_initialized(
    global_rank: int, world_size: int, master_addr: str, master_port: int | None = None
) -> None:
    """Check that the run's coordinator serves ``world_size`` processes with this one as ``global_rank``.

    lazyxla starts its coordinator (jax's distributed runtime) when the run starts (``python -m lazyxla.run``,
    ``xmp.spawn``, torchrun variables), so there is nothing left to start; a rank or size that differs from the
    run's raises ``RuntimeError``. (torch_xla's checkpoint tests and ``CheckpointManager`` call it.)

    Example::

        torch_xla._XLAC._ensure_xla_coordinator_initialized(global_rank=0, world_size=1, master_addr="localhost")
    """
    rank, size = processes.process_index(), processes.process_count()
    if (global_rank, world_size) != (rank, size):
        raise RuntimeError(
            f"_ensure_xla_coordinator_initialized(global_rank={global_rank}, world_size={world_size}): this run's "
            f"coordinator serves {size} process(es) and this one is rank {rank}"
        )


def _xla_get_auto_sharding() -> bool:
    """Whether auto-sharding mode is on (``torch_xla.runtime.use_spmd(auto=True)``, which says what it means in
    lazyxla).

    Example::

        xr.use_spmd(auto=True)
        assert torch_xla._XLAC._xla_get_auto_sharding()
    """
    return met.auto_sharding()


def _xla_set_mat_mul_precision(precision: str) -> None:
    """Set the precision of float32 matmuls: ``lazyxla.config.matmul_precision`` ('default', 'high', 'highest').

    Example::

        torch_xla._XLAC._xla_set_mat_mul_precision("highest")      # torch_xla's test_pallas.py does this
    """
    if precision not in ("default", "high", "highest"):
        raise ValueError(
            f"_xla_set_mat_mul_precision: precision must be 'default', 'high' or 'highest', got {precision!r}"
        )
    lazyxla.config.matmul_precision = precision


def _xla_get_mat_mul_precision() -> str:
    """The precision of float32 matmuls (``lazyxla.config.matmul_precision``).

    Example::

        torch_xla._XLAC._xla_get_mat_mul_precision()                # 'highest'
    """
    return lazyxla.config.matmul_precision


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
