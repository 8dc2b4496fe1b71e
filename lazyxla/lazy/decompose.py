"""Ops without a rule of their own, rewritten into ops that have one, or run on the CPU.

In-place and ``out=`` overloads met below functionalization (from a decomposition) run their
functional overload and rebind the mutated tensors; ``_foreach_*`` ops run their element op per
tensor; other ops run PyTorch's core-ATen decomposition (or their CompositeImplicit kernel); what is
left runs on the CPU (``fallback``: counted, warned once, an error in strict mode). The rewritten ops
go back through ``lazy.record.dispatch``, which the functions here take as an argument: routing sits
above this module.
"""

from __future__ import annotations

import functools

import torch

from lazyxla import torch_private
from lazyxla.config import config
from lazyxla.device.devices import on_device
from lazyxla.lazy import graph
from lazyxla.lazy.meta import leaves, record, shared_scalars
from lazyxla.lazy.special import cpu_to_lazy, inside_decomposition, lazy_to_cpu
from lazyxla.lazy.tensor import LazyTensor, retarget, set_value
from lazyxla.lowering.rules.foreach import GROUPS, element_op, split
from lazyxla.observe import metrics
from lazyxla.util import warn_once

aten = torch.ops.aten


@functools.cache
def _core_decompositions() -> dict:
    return torch_private.core_aten_decompositions()


@functools.cache
def decomposition(func):
    """PyTorch's decomposition of ``func`` into core aten ops (or its CompositeImplicit kernel), or None."""
    # Only decompositions into core aten ops: the general table also holds refs that lower to prims.
    table = _core_decompositions()
    if func in table:
        return table[func]
    if torch_private.has_kernel(func.name(), "CompositeImplicitAutograd"):
        return func.decompose
    return None


@functools.cache
def functional_of(func):
    """For an in-place op ``aten.x_.ov``: the functional ``aten.x.ov`` (None if there is none)."""
    schema = func._schema
    base = schema.name.split("::")[1]
    if not base.endswith("_") or base.startswith("_foreach"):
        return None
    packet = getattr(aten, base[:-1], None)
    overload = getattr(packet, func._overloadname, None) if packet is not None else None
    if overload is None:
        # random in-place ops whose functional form has a name of its own: normal_ -> normal_functional
        packet = getattr(aten, base[:-1] + "_functional", None)
        overload = getattr(packet, func._overloadname, None) if packet is not None else None
    return overload


@functools.cache
def functional_of_out(func):
    """``aten.x.out``-style overload -> the overload of ``aten.x`` with the same non-out arguments."""
    schema = func._schema
    want = [a.name for a in schema.arguments if not a.is_out]
    packet = getattr(aten, schema.name.split("::")[1])
    for name in packet.overloads():
        cand = getattr(packet, name)
        if not cand._schema.is_mutable and [a.name for a in cand._schema.arguments] == want:
            return cand
    return None


def out_variant(func, args, kwargs, dispatch):
    """An ``out=`` op below functionalization (from a decomposition): compute the functional overload
    through ``dispatch``, then rebind ``out``."""
    functional = functional_of_out(func)
    outs = [kwargs[a.name] for a in func._schema.arguments if a.is_out and a.name in kwargs]
    if functional is None:  # the CPU runs it into CPU copies of out: their values come back below
        result = fallback(func, args, kwargs)
    else:
        kwargs = {k: v for k, v in kwargs.items() if not any(v is o for o in outs)}
        result = dispatch(functional, args, kwargs)
    results = result if isinstance(result, (list, tuple)) else (result,)
    for o, r in zip(outs, results):
        if tuple(o.shape) != tuple(r.shape):
            raise RuntimeError(
                f"lazyxla: {func} writes shape {tuple(r.shape)} into an out= tensor of shape {tuple(o.shape)}; "
                "resizing out= tensors is not supported on lazyxla, pass an out= tensor of the right shape"
            )
        set_value(o, r._value)
    return outs[0] if len(outs) == 1 else tuple(outs)


def inplace(functional, args, kwargs, dispatch, func=None):
    """An in-place op below functionalization: its ``functional`` overload through ``dispatch``, then
    ``self`` rebound to the result. An op writing several (list) arguments (``func``: torch.optim's fused steps,
    which DTensor runs on its bare local tensors in SPMD mode) has each rebound to its new values."""
    out = dispatch(functional, args, kwargs)
    if isinstance(out, torch.Tensor):
        set_value(args[0], out._value)
        return args[0]
    for written, new in zip(_written_arguments(func, args, kwargs), out):
        for target, value in zip(written, new):
            set_value(target, value._value)
    return None  # (these ops return nothing)


def _written_arguments(func, args, kwargs) -> list[list[torch.Tensor]]:
    """The arguments ``func`` writes, in its schema's order, each as a list of tensors."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            value = args[i] if i < len(args) else kwargs.get(a.name)
            out.append(list(value) if isinstance(value, (list, tuple)) else [value])
    return out


foreach_element_op = element_op  # (the name lazy.record routes by)


def _one_object_per_number(arg):
    """A foreach argument that is a list of Python numbers with its equal numbers (same type and bits: -0.0 is
    not 0.0) made one object, so that they share one graph input (``meta.shared_scalars``): AdamW's per-tensor
    step sizes, equal while the tensors' step counts are, are then one input, not one per tensor. A program is
    keyed by which of them are equal, as it is by which numbers are 0 or +-1: a change of that costs a compile,
    never a wrong value. Any other argument is returned as it is."""
    if not isinstance(arg, (list, tuple)) or not all(type(x) is float or type(x) is int for x in arg):
        return arg
    first: dict = {}
    return type(arg)(first.setdefault((type(x), x.hex() if type(x) is float else x), x) for x in arg)


def foreach(func, args, kwargs, dispatch):
    """``_foreach_x(lists...)``: one node when ``x`` has a rule (``lowering.rules.foreach``: recorded through
    ``dispatch``'s recorder, ``record``), else ``x`` applied to each element through ``dispatch``, arguments matched
    by schema position. Equal Python numbers share one graph input either way."""
    args = tuple(_one_object_per_number(a) for a in args)
    kwargs = {k: _one_object_per_number(v) for k, v in kwargs.items()}
    numbers = [x for b in (*args, *kwargs.values()) for x in (b if isinstance(b, (list, tuple)) else (b,))]
    with shared_scalars(numbers):  # one graph input per number object, not one per tensor
        if func in GROUPS and any(isinstance(a, list) and a for a in args):
            return record(func, args, kwargs)
        results = [dispatch(element_op(func), tuple(pos), kw) for pos, kw in split(func, args, kwargs)]
    if func._schema.name.endswith("_"):
        retarget(args[0], [r._value for r in results])
        return None
    return results


NO_RULE = "has no lowering rule nor decomposition"


def fallback(func, args, kwargs, why: str = NO_RULE):
    """Run ``func`` on the CPU: its inputs synced and copied to the host, its results copied back (counted as
    ``fallback.<op>``, warned once per op; an error in strict mode)."""
    name = str(func)
    if config.strict:
        raise NotImplementedError(
            f"lazyxla: {name} {why}, and strict mode forbids running it on the CPU. Set "
            "lazyxla.config.strict = False (or LAZYXLA_STRICT=0) to allow the CPU fallback, or avoid the op."
        )
    metrics.inc("fallback." + name)
    if config.warn_fallback:
        warn_once(
            "fallback:" + name,
            f"lazyxla: {name} {why}; it runs on the CPU (inputs synced, result copied back). "
            "This is slow; lazyxla.metrics.counters() counts it.",
            stacklevel=4,
        )
    device = None
    lazies = [a for a in leaves(args, kwargs) if isinstance(a, LazyTensor)]
    graph.sync_tensors(lazies, reason=f"fallback {name}")
    if lazies:
        device = lazies[0]._value[0].device

    def on_cpu(x):
        if isinstance(x, LazyTensor):
            return lazy_to_cpu(x)
        if isinstance(x, (list, tuple)):
            return type(x)(on_cpu(e) for e in x)
        if isinstance(x, torch.device) and on_device(x):
            return torch.device("cpu")
        return x

    cpu_args, cpu_kwargs = on_cpu(args), {k: on_cpu(v) for k, v in kwargs.items()}
    out = func(*cpu_args, **cpu_kwargs)

    def back(x):
        if isinstance(x, torch.Tensor):
            return cpu_to_lazy(x, device or 0)
        if isinstance(x, (list, tuple)):
            return type(x)(back(e) for e in x)
        return x

    _write_back(func, args, kwargs, cpu_args, cpu_kwargs, back)
    return back(out)


def _write_back(func, args, kwargs, cpu_args, cpu_kwargs, back) -> None:
    """The values an in-place op wrote into the CPU copies of its (non-out=) arguments, rebound to their lazyxla
    tensors: without it an in-place op run on the CPU left its lazyxla ``self`` unchanged (its result was dropped).
    ``out=`` tensors come back through the op's results (``out_variant``)."""
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write or a.is_out:
            continue
        lazy, cpu = (args[i], cpu_args[i]) if i < len(args) else (kwargs.get(a.name), cpu_kwargs.get(a.name))
        if isinstance(lazy, LazyTensor) and isinstance(cpu, torch.Tensor) and tuple(cpu.shape) == tuple(lazy.shape):
            set_value(lazy, back(cpu)._value)


def decomposed(decomp, args, kwargs):
    """``decomp(*args, **kwargs)``: a PyTorch decomposition run here, below functionalization."""
    with inside_decomposition():
        return decomp(*args, **kwargs)
