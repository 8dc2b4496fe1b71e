"""PyTorch's alert for an op with no deterministic implementation, under
``torch.use_deterministic_algorithms(True)``.

PyTorch's kernels call ``alertNotDeterministic(name)`` for such ops: a ``RuntimeError`` (a ``UserWarning`` with
``warn_only=True``) naming the op, at the call. lazyxla's ops never reach those kernels, so the ops whose XLA
lowering is not deterministic either raise the same alert here. ``put_`` without ``accumulate`` is one: its
lowering is an XLA scatter, and which of two writes to the same element wins is not defined (PyTorch alerts
for it on every device). Ops PyTorch alerts for on CUDA only (``index_add_``, ``scatter_add_``, ``cumsum``,
... whose CUDA kernels use atomics) are not listed: PyTorch's tests expect no alert off CUDA.

Example::

    torch.use_deterministic_algorithms(True)
    x.put_(idx, v)      # RuntimeError: put_ does not have a deterministic implementation, but you set ...
"""

from __future__ import annotations

import warnings

import torch

aten = torch.ops.aten

# op -> its arguments by name -> the name PyTorch's alert gives it, or None when this call is deterministic
ALERTS: dict = {
    aten.put.default: lambda a: None if a["accumulate"] else "put_",
}


def alert(func, a: dict) -> None:
    """Raise (or warn, with ``warn_only=True``) PyTorch's alert if ``func`` called with arguments ``a`` (by name)
    has no deterministic implementation and deterministic algorithms are on.

    Example::

        alert(aten.put.default, {"accumulate": False, ...})   # RuntimeError under use_deterministic_algorithms
    """
    rule = ALERTS.get(func)
    if rule is None or not torch.are_deterministic_algorithms_enabled():
        return
    name = rule(a)
    if name is None:
        return
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(
            f"{name} does not have a deterministic implementation, but you set "
            "'torch.use_deterministic_algorithms(True, warn_only=True)'. You can file an issue at "
            "https://github.com/pytorch/pytorch/issues to help us prioritize adding deterministic support for "
            "this operation.",
            stacklevel=2,
        )
        return
    raise RuntimeError(
        f"{name} does not have a deterministic implementation, but you set "
        "'torch.use_deterministic_algorithms(True)'. You can turn off determinism just for this operation, or "
        "you can use the 'warn_only=True' option, if that's acceptable for your application. You can also file "
        "an issue at https://github.com/pytorch/pytorch/issues to help us prioritize adding deterministic "
        "support for this operation."
    )
