"""``torch_xla.experimental.scan_layers`` on lazyxla: a stack of identical layers run as one loop over the
first layer's code (``lazyxla.scan_layers``), forward and backward.

Example::

    from torch_xla.experimental.scan_layers import scan_layers
    hidden = scan_layers(model.layers, hidden)          # instead of: for layer in model.layers: ...
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from lazyxla.compat.torch_xla.experimental.scan import checkpoint_of
from lazyxla.frontend import scan as _scan


def scan_layers(
    layers: Iterable[torch.nn.Module],
    input_data: Any,
    partition_fn: Callable | None = None,
    is_layer_pure: bool = False,
):
    """Run ``layers`` one after the other on ``input_data`` (the same as ``nn.Sequential(*layers)``), the
    program holding one layer. The layers must have the same structure: different parameter names raise
    ``ValueError("Layer i has mismatched keys. ...")``, different shapes ``ValueError("Shape mismatch for
    ...")`` (as torch_xla), and lazyxla also checks dtypes, classes and submodules. No layers: returns
    ``input_data``. ``partition_fn`` and ``is_layer_pure`` as in ``torch_xla.experimental.scan.scan``.

    Example::

        layers = [nn.Linear(16, 16).to(dev) for _ in range(10)]
        out = scan_layers(layers, torch.randn(16, device=dev))
    """
    return _scan.scan_layers(layers, input_data, checkpoint=checkpoint_of(partition_fn), pure=is_layer_pure)


__all__ = ["scan_layers"]
