"""The dispatch target: route each aten op to the module that runs it.

Ops reach ``dispatch`` from ``LazyTensor.__torch_dispatch__`` after functionalization, so they are
functional. In order, an op is: handled by its own handler (``lazy.special``: transfers, host reads,
aliases), recorded as a node (it has a lowering rule: ``lazy.meta.record``), or rewritten or run on the
CPU (``lazy.decompose``: split per tensor for ``_foreach_*``, in-place and ``out=`` overloads, PyTorch's
decomposition, else a counted, warned CPU fallback; an error in strict mode). ``status_of`` says which
of these an op takes. The modules import one way: record → decompose → special → meta.
"""

from __future__ import annotations

import torch

from lazyxla import torch_private
from lazyxla.device.devices import torch_device
from lazyxla.lazy import bounds, indices
from lazyxla.lazy.decompose import (
    NO_RULE,
    decomposed,
    decomposition,
    fallback,
    foreach,
    foreach_element_op,
    functional_of,
    functional_of_out,
    inplace,
    out_variant,
)
from lazyxla.lazy.known import FOLDABLE_SPECIAL, NOT_FOLDED, fold
from lazyxla.lazy.meta import DeviceMismatch, NoMeta, check_before_decomposing, leaves, record, scalar_args
from lazyxla.lazy.special import SPECIAL
from lazyxla.lazy.tensor import LazyTensor, set_dispatch
from lazyxla.lowering.registry import RULES
from lazyxla.util import Memo

# Ops the device's own kernels take before any dispatch here (factories, empty, copies): filled by _core.
DEVICE_KERNEL_OPS: set = set()


def status_of(func) -> str:
    """How lazyxla runs ``func``: 'rule', 'special', 'kernel', 'decomposition', 'functionalized' or
    'fallback'."""
    if func in SPECIAL:
        return "special"
    if func in DEVICE_KERNEL_OPS:
        return "kernel"
    if func in RULES:
        return "rule"
    if func._schema.name.startswith("aten::_foreach_") and foreach_element_op(func) is not None:
        return "decomposition"
    if functional_of(func) is not None or (
        func._schema.is_mutable and any(a.is_out for a in func._schema.arguments) and functional_of_out(func)
    ):
        return "functionalized"
    if decomposition(func) is not None:
        return "decomposition"
    return "fallback"


def _check_devices(args, kwargs) -> None:
    """Raise PyTorch's device-mismatch error for a non-0-dim tensor that is not on lazyxla."""
    indices = set()
    for x in leaves(args, kwargs):
        if isinstance(x, LazyTensor):
            indices.add(x._value[0].device)
        elif isinstance(x, torch.Tensor) and x.dim() != 0:
            raise DeviceMismatch(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"{torch_device(min(indices, default=0))} and {x.device}! Move the tensor with .to(lazyxla.device())."
            )
    if len(indices) > 1:
        a, b = sorted(indices)[:2]
        raise DeviceMismatch(
            "Expected all tensors to be on the same device, but found at least two devices, "
            f"{torch_device(a)} and {torch_device(b)}!"
        )


# id(op) -> (special handler or None, whether it has a rule, (Scalar positions, Scalar keyword names), whether
# it may be computed on the host from known values, its index bounds check or None, its advanced indices' preparation
# or None):
# one int-keyed lookup per op instead of several dict lookups that each hash the OpOverload in Python. One entry per
# op used: PyTorch has ~4,000 overloads (``torch._C._jit_get_all_schemas()``), custom ops add a few.
_routes = Memo("lazyxla.lazy.record._routes", limit=20_000)


def _route(func) -> tuple:
    special = SPECIAL.get(func)
    foldable = (special is None and func in RULES) or func in FOLDABLE_SPECIAL  # lazy/known.py may compute it
    route = (special, func in RULES, scalar_args(func), foldable, bounds.checker(func), indices.preparer(func))
    return _routes.remember(id(func), route)


def dispatch(func, args, kwargs):
    """Run one aten op on LazyTensors (below functionalization): handled, recorded, rewritten or run on
    the CPU, in the order of this module's docstring; returns its LazyTensor output(s)."""
    try:
        return _dispatch(func, args, kwargs)
    except DeviceMismatch:
        if not any(isinstance(x, torch.Tensor) and x.is_meta for x in leaves(args, kwargs)):
            raise
    return _on_meta(func, args, kwargs)


_META_KEYSET = torch_private.DispatchKeySet(torch_private.DispatchKey.Meta)


def _on_meta(func, args, kwargs):
    """``func`` with a meta tensor among its arguments, as PyTorch runs it for any device: the dispatcher
    prefers the Meta key, so the op's meta kernel computes it (``x @ meta_weight``: mm's meta kernel makes its
    output with ``x.new_empty``, an uninitialized lazyxla tensor, as CUDA gets an uninitialized CUDA one; a
    module before ``to_empty``). Ops whose meta kernel checks devices raise their own error."""
    return func.redispatch(_META_KEYSET, *args, **kwargs)


def _dispatch(func, args, kwargs):
    route = _routes.table.get(id(func)) or _route(func)
    if route[5] is not None:  # x[i], x[mask]: CPU indices, byte masks and known masks as PyTorch's kernels take them
        args, kwargs = route[5](func, args, kwargs, dispatch)
    if route[4] is not None and not bounds.inside():  # an op that reads indices: checked, then dispatched
        return route[4](func, args, kwargs, dispatch)
    if route[3]:
        out = fold(func, args, kwargs)
        if out is not NOT_FOLDED:
            return out
    special = route[0]
    if special is not None:
        return special(*args, **kwargs)
    why = NO_RULE
    if route[1]:
        try:
            return record(func, args, kwargs, route[2])
        except NoMeta:
            why = "has an output shape that depends on the data (or no meta kernel) for these arguments"
    _check_devices(args, kwargs)
    if func._schema.name.startswith("aten::_foreach_") and foreach_element_op(func) is not None:
        return foreach(func, args, kwargs, dispatch)
    functional = functional_of(func)
    if functional is not None:
        return inplace(functional, args, kwargs, dispatch)
    if func._schema.is_mutable and any(a.is_out for a in func._schema.arguments):
        return out_variant(func, args, kwargs, dispatch)
    decomp = decomposition(func)
    if decomp is not None:
        check_before_decomposing(func, args, kwargs, route[2])
        out = decomposed(decomp, args, kwargs)
        if out is not NotImplemented:
            return out
    out = fold(func, args, kwargs)  # an op with no rule on known values: the CPU computes it without a sync
    return out if out is not NOT_FOLDED else fallback(func, args, kwargs, why)


set_dispatch(dispatch)  # every op on a LazyTensor comes here (tensor.py cannot import this module)
