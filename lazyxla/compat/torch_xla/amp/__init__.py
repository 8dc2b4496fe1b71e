"""``torch_xla.amp`` on lazyxla: ``autocast``, ``GradScaler``, ``custom_fwd``/``custom_bwd``, ``syncfree``.

``torch_xla.amp.autocast(device, ...)`` is ``torch.autocast("xla", ...)`` with bfloat16 as the
default dtype (torch_xla's default on TPU; lazyxla uses it on every platform). ``GradScaler`` is
``torch.amp.GradScaler("xla")``: its inf check and scale update run on the device; with a fused
optimizer (``fused=True``) the skip of an overflowing step is decided there too, otherwise GradScaler reads
the inf flag on the host once per step. bfloat16 needs no scaler. (Where the device keeps lazyxla's name,
``lazyxla.compat.install()`` after ``import lazyxla``, each of these names ``"lazyxla"`` instead.)

Example::

    from torch_xla.amp import autocast
    with autocast(xm.xla_device()):
        loss = loss_fn(model(x), y)          # matmuls and convolutions in bfloat16
    loss.backward()
"""

from __future__ import annotations

import torch

from lazyxla.compat._common import missing_attribute
from lazyxla.device.devices import DEVICE_NAMES, torch_name

__all__ = ["GradScaler", "autocast", "custom_bwd", "custom_fwd", "syncfree"]


class autocast(torch.amp.autocast_mode.autocast):  # noqa: N801  (torch_xla's name)
    """Mixed precision on the lazyxla device: ``torch.autocast("xla", dtype=dtype or torch.bfloat16)``.

    ``device`` is the device (or its name) the region runs on; it must be the device (``xla`` or ``lazyxla``).

    Example::

        with autocast(xm.xla_device()):
            y = model(x)
    """

    def __init__(self, device, enabled: bool = True, dtype: torch.dtype | None = None, cache_enabled: bool = True):
        kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
        if kind not in DEVICE_NAMES:
            raise ValueError(f"torch_xla.amp.autocast is for the XLA device (lazyxla here), got {device!r}")
        super().__init__(
            torch_name(), enabled=enabled, dtype=torch.bfloat16 if dtype is None else dtype, cache_enabled=cache_enabled
        )


class GradScaler(torch.amp.GradScaler):
    """Loss scaling for float16 training: ``torch.amp.GradScaler("xla")`` with torch_xla's arguments
    (``use_zero_grad`` is accepted and unused).

    Example::

        scaler = GradScaler()
        scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        use_zero_grad: bool = False,
    ) -> None:
        super().__init__(
            torch_name(),
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            enabled=enabled,
        )


def custom_fwd(fwd=None, *, cast_inputs: torch.dtype | None = None):
    """``torch.amp.custom_fwd`` for the lazyxla device.

    Example::

        class F(torch.autograd.Function):
            @staticmethod
            @custom_fwd(cast_inputs=torch.float32)
            def forward(ctx, x): ...
    """
    return torch.amp.custom_fwd(fwd, device_type=torch_name(), cast_inputs=cast_inputs)


def custom_bwd(bwd=None):
    """``torch.amp.custom_bwd`` for the lazyxla device.

    Example::

        @staticmethod
        @custom_bwd
        def backward(ctx, g): ...
    """
    return torch.amp.custom_bwd(bwd, device_type=torch_name())


from lazyxla.compat.torch_xla.amp import syncfree  # noqa: E402


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
