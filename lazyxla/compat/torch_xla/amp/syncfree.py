"""``torch_xla.amp.syncfree`` on lazyxla: ``SGD``, ``Adam``, ``AdamW`` taking ``step(found_inf=...)``.

They are PyTorch's optimizers. ``found_inf`` (a tensor that is non-zero when the gradients overflowed)
skips the update; lazyxla reads it on the host to decide, which costs one execution per step (torch_xla's
versions decide on the device). With ``found_inf=None`` they are exactly PyTorch's.

Example::

    from torch_xla.amp import syncfree
    opt = syncfree.AdamW(model.parameters(), lr=1e-3)
"""

from __future__ import annotations

import torch

from lazyxla.compat._common import missing_attribute

__all__ = ["SGD", "Adam", "AdamW"]


def _step(cls):
    def step(self, closure=None, found_inf: torch.Tensor | None = None):
        if found_inf is not None and bool(found_inf.detach().cpu().ne(0).any()):
            return None
        return cls.step(self, closure)

    step.__doc__ = f"``torch.optim.{cls.__name__}.step``; skipped when ``found_inf`` is non-zero."
    return step


class SGD(torch.optim.SGD):
    """``torch.optim.SGD`` with ``step(closure=None, found_inf=None)``.

    Example::

        opt = syncfree.SGD(model.parameters(), lr=0.1, momentum=0.9)
    """

    step = _step(torch.optim.SGD)


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` with ``step(closure=None, found_inf=None)``.

    Example::

        opt = syncfree.Adam(model.parameters(), lr=1e-3)
    """

    step = _step(torch.optim.Adam)


class AdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` with ``step(closure=None, found_inf=None)``.

    Example::

        opt = syncfree.AdamW(model.parameters(), lr=1e-3)
    """

    step = _step(torch.optim.AdamW)


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
