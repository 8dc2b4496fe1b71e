"""How lazyxla registers torch_xla's custom ops (``torch.ops.xla.<name>``) on ``XLA_LIB``.

torch_xla registers each kernel at its XLA dispatch key and a shape-only kernel at ``CompositeExplicitAutograd``
(``empty_like``-style, for fake and meta tensors). A lazyxla tensor as the user holds it is a functionalization
wrapper, whose first key after autograd is Functionalize (below it, the inner tensor's Python key would record the
op as one lazyxla cannot lower and run it on the CPU): the device kernels are registered there (:func:`register`).
A tensor elsewhere (a CPU tensor, a fake one in torch.compile's tracing) goes on below functionalization to the
``CompositeExplicitAutograd`` kernel, so a compiled graph records the op itself.

Example::

    register("flash_attention", flash_attention_xla, flash_attention_non_xla, first=("q", "k"))
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from lazyxla import torch_private
from lazyxla.compat.torch_xla.core.xla_model import XLA_LIB
from lazyxla.device import devices


def on_lazyxla(*tensors: torch.Tensor) -> bool:
    """Whether the op's tensors hold lazyxla values (not fake tensors of the lazyxla device in a trace).

    Example::

        on_lazyxla(q, k)       # True for tensors moved to lazyxla.device()
    """
    return all(devices.on_device(t) and not torch_private.is_fake(t) for t in tensors)


def below_functionalization(op, args: tuple, kwargs: dict) -> torch.Tensor:
    """``op`` on the tensors inside the functionalization wrappers, its result wrapped again: PyTorch's own
    Functionalize fallback for an op that writes nothing. Why: AOTAutograd's functionalization (torch.compile)
    calls the Functionalize kernel on fake tensors, and the graph must record the op itself (running it op by op
    at run time), not what its shape kernel returns.

    Example::

        below_functionalization(torch.ops.xla.gmm.default, (lhs, rhs, sizes), {})
    """

    def inner(x):
        if isinstance(x, torch.Tensor) and torch_private.is_functional(x):
            torch_private.functional_sync(x)
            return torch_private.from_functional(x)
        return x

    below = torch_private.DispatchKeySet(torch_private.DispatchKey.Functionalize)
    with torch_private.ExcludeDispatchKeyGuard(below):
        out = op(*map(inner, args), **kwargs)
    return torch_private.to_functional(out)


def warn_off_device(probe: torch.Tensor, what: str) -> None:
    """torch_xla's warning when its op's shape kernel runs on real (not meta) tensors off its device.

    Example::

        warn_off_device(lhs, "gmm")      # warns for a CPU tensor, not for a meta one
    """
    if probe.device != torch.device("meta"):
        warnings.warn(f"XLA {what} should only be applied to tensors on XLA device", stacklevel=3)


def register(name: str, schema: str, device_kernel: Callable, shape_kernel: Callable, probes: int = 2) -> None:
    """Define ``torch.ops.xla.<name>`` with ``schema``; lazyxla tensors run ``device_kernel``, others go below
    functionalization to ``shape_kernel`` (``CompositeExplicitAutograd``). ``probes``: how many leading tensor
    arguments decide whether the call is on lazyxla.

    Example::

        register("gmm", "gmm(Tensor lhs, Tensor rhs, Tensor group_sizes) -> Tensor", gmm_xla, gmm_non_xla)
    """
    XLA_LIB.define(schema)
    op = getattr(torch.ops.xla, name).default

    def functionalize(*args, **kwargs):
        if on_lazyxla(*args[:probes]):
            return device_kernel(*args, **kwargs)
        return below_functionalization(op, args, kwargs)

    torch.library.impl(XLA_LIB, name, "Functionalize")(functionalize)
    torch.library.impl(XLA_LIB, name, "CompositeExplicitAutograd")(shape_kernel)
