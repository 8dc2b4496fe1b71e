"""The dispatch target: route each aten op to the module that runs it.

Ops reach ``dispatch`` from ``LazyTensor.__torch_dispatch__`` after functionalization, so they are
functional. In order, an op is: handled by its own handler (``lazy.special``: transfers, host reads,
aliases), recorded as a node (it has a lowering rule: ``lazy.meta.record``), or rewritten or run on the
CPU (``lazy.decompose``: split per tensor for ``_foreach_*``, in-place and ``out=`` overloads, PyTorch's
decomposition, else a counted, warned CPU fallback; an error in strict mode). ``status_of`` says which
of these an op takes. The modules import one way: record → decompose → special → meta.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

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
from lazyxla.lazy.special import SPECIAL, SPECIAL_BY_NAME
from lazyxla.lazy.tensor import LazyTensor, set_dispatch
from lazyxla.lowering.registry import RULES
from lazyxla.lowering.rules.foreach import GROUPS
from lazyxla.util import Memo

# Ops the device's own kernels take before any dispatch here (factories, empty, copies): filled by _core.
DEVICE_KERNEL_OPS: set = set()


def status_of(func) -> str:
    """How lazyxla runs ``func``: 'rule', 'special', 'kernel', 'decomposition', 'functionalized' or
    'fallback'."""
    if func in SPECIAL or str(func) in SPECIAL_BY_NAME:
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


class Route(NamedTuple):
    """What ``dispatch`` needs to know about an op, found once per op (``_route``).

    Example: ``_route(aten.sin.default)`` is ``Route(special=None, has_rule=True, scalars=((NUMBERS,), {}),
    foldable=True, check_bounds=None, prepare_indices=None)``.
    """

    special: Callable | None  # its own handler (lazy.special), or None
    has_rule: bool  # a lowering rule records it (lazy.meta.record)
    scalars: tuple  # (Scalar positions, Scalar keyword names): ``meta.scalar_args``
    foldable: bool  # lazy/known.py may compute it on the host from known values
    check_bounds: Callable | None  # its index bounds check (lazy.bounds), or None
    prepare_indices: Callable | None  # its advanced indices' preparation (lazy.indices), or None


# id(op) -> its Route: one int-keyed lookup per op instead of several dict lookups that each hash the OpOverload in
# Python. One entry per op used: PyTorch has ~4,000 overloads (``torch._C._jit_get_all_schemas()``), custom ops add a
# few.
_routes = Memo("lazyxla.lazy.record._routes", limit=20_000)


def _route(func) -> Route:
    special = SPECIAL.get(func) or (SPECIAL_BY_NAME.get(str(func)) if SPECIAL_BY_NAME else None)
    # a foreach group (lowering/rules/foreach.py) has a rule, but is recorded by lazy.decompose.foreach, which makes
    # its equal Python numbers one input each (and lazy/known.py computes its elements one by one)
    rule = func in RULES and func not in GROUPS
    foldable = (special is None and rule) or func in FOLDABLE_SPECIAL  # lazy/known.py may compute it
    route = Route(special, rule, scalar_args(func), foldable, bounds.checker(func), indices.preparer(func))
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
    # unpacked once: as fast as indexing a plain tuple six times, where a NamedTuple's attributes cost twice that
    special, has_rule, scalars, foldable, check_bounds, prepare_indices = _routes.table.get(id(func)) or _route(func)
    if prepare_indices is not None:  # x[i], x[mask]: CPU indices, byte masks and known masks as PyTorch's take them
        args, kwargs = prepare_indices(func, args, kwargs, dispatch)
    if check_bounds is not None and not bounds.inside():  # an op that reads indices: checked, then dispatched
        return check_bounds(func, args, kwargs, dispatch)
    if foldable:
        out = fold(func, args, kwargs)
        if out is not NOT_FOLDED:
            return out
    if special is not None:
        return special(*args, **kwargs)
    why = NO_RULE
    if has_rule:
        try:
            return record(func, args, kwargs, scalars)
        except NoMeta:
            why = "has an output shape that depends on the data (or no meta kernel) for these arguments"
    if func in GROUPS:  # one node (lowering/rules/foreach.py); its recorder checks the devices of its lists
        return foreach(func, args, kwargs, dispatch)
    _check_devices(args, kwargs)
    if func._schema.name.startswith("aten::_foreach_") and foreach_element_op(func) is not None:
        return foreach(func, args, kwargs, dispatch)
    functional = functional_of(func)
    if functional is not None:
        return inplace(functional, args, kwargs, dispatch, func)
    if func._schema.is_mutable and any(a.is_out for a in func._schema.arguments):
        return out_variant(func, args, kwargs, dispatch)
    decomp = decomposition(func)
    if decomp is not None:
        check_before_decomposing(func, args, kwargs, scalars)
        out = decomposed(decomp, args, kwargs)
        if out is not NotImplemented:
            return out
    out = fold(func, args, kwargs)  # an op with no rule on known values: the CPU computes it without a sync
    return out if out is not NOT_FOLDED else fallback(func, args, kwargs, why)


set_dispatch(dispatch)  # every op on a LazyTensor comes here (tensor.py cannot import this module)
