"""The dispatch target: record each aten op as an IR node, with PyTorch's meta kernels for shapes.

Ops reach ``dispatch`` from ``LazyTensor.__torch_dispatch__`` after functionalization, so they are
functional. In order, an op is: handled here (transfers, host reads, aliases), recorded (it has a
lowering rule), decomposed (PyTorch has a decomposition), split per tensor (``_foreach_*``), or run
on the CPU (a counted, warned fallback; an error in strict mode).
"""

from __future__ import annotations

import functools
import threading

import torch
import torch._decomp

from lazyxla.config import config
from lazyxla.device import devices as runtime  # (the module's name before the move; record's code says runtime)
from lazyxla.ir import Aval, In, Leaf, canonical, leaf, node, op_hash, raise_if_error, slot
from lazyxla.lazy import check, graph, rng
from lazyxla.lazy.tensor import LazyTensor, set_dispatch, wrap
from lazyxla.lowering import to_jax
from lazyxla.lowering.registry import RULES
from lazyxla.observe import diagnostics, metrics
from lazyxla.observe.metrics import _counters
from lazyxla.util import warn_once

_flags = config._values  # read per op: a dict lookup, not lazyxla.config's attribute hook

aten = torch.ops.aten

# Python floats in these ops stay constants: they decide output shapes (arange, ...) or select the
# algorithm (a norm's ord), so a graph input would not do.
_CONST_SCALAR_OPS = frozenset(
    {"aten::arange", "aten::linspace", "aten::logspace", "aten::range", "aten::linalg_vector_norm"}
)
# Python floats in these ops that stay constants: 0 and +-1 simplify the program.
_CONST_FLOATS = frozenset({0.0, 1.0, -1.0})
# Ops whose ``float`` arguments are tensor math too, not only their ``Scalar`` ones: the fused optimizer steps
# take the learning rate and betas as ``float``, and a schedule (or OneCycleLR's momentum) changes them per step.
_FLOAT_INPUT_OPS = frozenset({"aten::_fused_adam", "aten::_fused_adamw", "aten::_fused_sgd", "aten::_fused_adagrad"})


class DeviceMismatch(RuntimeError):
    pass


class _NoMeta(Exception):
    """PyTorch cannot infer the op's output shape without the data: it runs like an op without a rule."""


def _is_scalar_type(t) -> bool:
    """Argument types where a Python float is tensor math (``Scalar``, or a number passed as ``Tensor``)."""
    if isinstance(t, (torch.NumberType, torch.TensorType)):
        return True
    if isinstance(t, torch.OptionalType):
        return _is_scalar_type(t.getElementType())
    if isinstance(t, torch.ListType):
        return _is_scalar_type(t.getElementType())
    return False


@functools.cache
def _scalar_args(func) -> tuple[tuple[bool, ...], frozenset[str]]:
    """Which positional args and which keyword args of ``func`` are ``Scalar`` (or lists of them)."""
    schema = func._schema
    if schema.name in _CONST_SCALAR_OPS:
        return (), frozenset()
    floats = schema.name in _FLOAT_INPUT_OPS

    def scalar(a) -> bool:
        return _is_scalar_type(a.type) or (floats and isinstance(a.type, torch.FloatType))

    pos = tuple(scalar(a) for a in schema.arguments if not a.kwarg_only)
    kw = frozenset(a.name for a in schema.arguments if a.kwarg_only and scalar(a))
    return pos, kw


class _Flat:
    """Args of one op flattened into a hashable template, its input values and their avals."""

    __slots__ = ("inputs", "avals", "device", "meta_subst")

    def __init__(self) -> None:
        self.inputs: list = []
        self.avals: list = []
        self.device: int | None = None
        self.meta_subst: list = []  # per input: an Aval (a tensor) or a Python value (a scalar input)

    def tensor(self, t: LazyTensor):
        n = t._value[0]
        if self.device is None:
            self.device = n.device
        elif n.device != self.device:
            raise DeviceMismatch(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"lazyxla:{self.device} and lazyxla:{n.device}!"
            )
        return self._add(t._value, t._aval, None)

    def _add(self, value, aval, subst):
        self.inputs.append(value)
        self.avals.append(aval)
        self.meta_subst.append(aval if subst is None else subst)
        return slot(len(self.inputs) - 1)

    def conv(self, x, scalar: bool):
        if isinstance(x, LazyTensor):
            return self.tensor(x)
        if isinstance(x, torch.Tensor):
            return self.host_tensor(x)
        if isinstance(x, (list, tuple)):
            return tuple(self.conv(e, scalar) for e in x)
        if scalar and type(x) is float and x not in _CONST_FLOATS:
            aval = Aval((), torch.float64)
            return self._add((leaf(Leaf.SCALAR, x, aval, -1), 0), aval, x)
        return x

    def host_tensor(self, t: torch.Tensor):
        if t.dim() != 0:
            raise DeviceMismatch(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"lazyxla:{self.device or 0} and {t.device}! Move the tensor with .to(lazyxla.device()) "
                "(0-dim CPU tensors are allowed, as for CUDA)."
            )
        aval = Aval((), t.dtype)
        value = (_Pending0d(t), 0)  # placed on the device once the op's device is known
        return self._add(value, aval, None)


class _Pending0d:
    __slots__ = ("t",)

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


def _flatten(func, args, kwargs, place: bool = True):
    """The call's template and inputs; with ``place``, 0-d CPU tensors are moved to the op's device."""
    pos_scalar, kw_scalar = _scalar_args(func)
    flat = _Flat()
    targs = tuple(flat.conv(a, i < len(pos_scalar) and pos_scalar[i]) for i, a in enumerate(args))
    tkw = tuple(sorted((k, flat.conv(v, k in kw_scalar)) for k, v in kwargs.items()))
    if flat.device is None:
        flat.device = _device_kwarg(kwargs)
    if not place:
        return (targs, tkw), flat
    for i, (value, aval) in enumerate(zip(flat.inputs, flat.avals)):
        if type(value[0]) is _Pending0d:
            metrics.inc("host_to_device")
            data = runtime.to_device(value[0].t, flat.device)
            n = leaf(Leaf.DATA, data, aval, flat.device)
            n.source = "a 0-d CPU tensor used in device math"
            flat.inputs[i] = (n, 0)
    return (targs, tkw), flat


def _device_kwarg(kwargs) -> int:
    dev = kwargs.get("device")
    if isinstance(dev, torch.device) and dev.type == "lazyxla":
        return dev.index or 0
    return 0


# ---- meta inference, memoized by (op, template, input avals) ----

_meta_cache: dict = {}


def _meta_tensor(aval: Aval) -> torch.Tensor:
    return torch.empty(aval.shape, dtype=aval.dtype, device="meta")


def _instantiate(x, subst, make, device: torch.device):
    """The template ``x`` with each input made by ``make(aval)`` (Python scalars as they are) and each
    device argument replaced by ``device``."""
    if type(x) is tuple:
        return tuple(_instantiate(e, subst, make, device) for e in x)
    if type(x) is In:
        s = subst[x.i]
        return make(s) if isinstance(s, Aval) else s
    if isinstance(x, torch.device):
        return device
    return x


def _call_args(template, subst, args, kwargs, make, device: torch.device):
    """The op's ``(args, kwargs)`` rebuilt from its template on tensors made by ``make`` (lists where the
    original had lists)."""
    targs, tkw = template
    cargs = _relist(_instantiate(targs, subst, make, device), list(args))
    ckw = {k: _relist(_instantiate(v, subst, make, device), kwargs[k]) for k, v in tkw}
    return cargs, ckw


def _relist(x, like):
    """Restore lists where the original args had lists (templates hold tuples)."""
    if isinstance(like, list):
        return [_relist(e, lk) for e, lk in zip(x, like)]
    if isinstance(like, tuple) and type(x) is tuple:
        return tuple(_relist(e, lk) for e, lk in zip(x, like))
    return x


def _spec(out, avals: list):
    if isinstance(out, torch.Tensor):
        avals.append(Aval(tuple(out.shape), out.dtype))
        return len(avals) - 1
    if isinstance(out, (list, tuple)):
        return (type(out), tuple(_spec(o, avals) for o in out))
    return ("const", out)


def _meta_key(func, ckey, flat: _Flat) -> tuple:
    # a Python float shares its aval with a 0-d float64 tensor, but not PyTorch's promotion rules
    return (func, ckey, tuple(s if isinstance(s, Aval) else float for s in flat.meta_subst))


def _infer(func, template, ckey, flat: _Flat, args, kwargs):
    key = _meta_key(func, ckey, flat)
    try:
        return _meta_cache[key]
    except KeyError:
        pass
    except TypeError:  # unhashable constant
        key = None
    margs, mkw = _call_args(template, flat.meta_subst, args, kwargs, _meta_tensor, _META)
    with torch._C._DisableFuncTorch(), _no_python_dispatch():
        try:
            out = func(*margs, **mkw)
        except NotImplementedError as e:  # no meta kernel, or a data-dependent shape (a boolean mask)
            if func not in _MISSING_META:
                raise _NoMeta(str(e)) from e
            out = _MISSING_META[func](*margs, **mkw)
        except Exception as e:  # the CPU kernel's exception type, if it raises another, is PyTorch's answer
            _check_on_cpu(func, template, flat, args, kwargs, (), meta_error=e)
            raise
    avals: list = []
    result = (_spec(out, avals), tuple(avals))
    for aval in result[1]:
        runtime.np_dtype(aval.dtype)  # an unsupported dtype (complex32, ...) raises here, at the call
    _check_on_cpu(func, template, flat, args, kwargs, result[1])
    if key is not None:
        _meta_cache[key] = result
    return result


def _new_values_meta(func):
    """Output metadata of a functional op whose outputs are new values of its inputs: the fused optimizer steps
    and AMP's ops (``self_out`` is a new ``self``, ``grads_out`` new ``grads``; an unnamed output is ``self``)."""
    names = [a.name for a in func._schema.arguments]
    outs = [r.name.removesuffix("_out") or "self" for r in func._schema.returns]

    def meta(*args, **kwargs):
        bound = {**dict(zip(names, args)), **kwargs}
        like = [bound[n] for n in outs]
        return tuple([torch.empty_like(t) for t in x] if isinstance(x, list) else torch.empty_like(x) for x in like)

    return meta


_META = torch.device("meta")
_CPU = torch.device("cpu")


def _check_on_cpu(func, template, flat: _Flat, args, kwargs, out_avals, meta_error=None) -> None:
    """Raise, at the call, the error PyTorch's CPU kernel raises for this call (see ``lazy.check``)."""
    limit = _flags["check_max_elements"]
    in_avals = [s for s in flat.meta_subst if isinstance(s, Aval)]
    if limit <= 0 or check.numel(in_avals) + check.numel(out_avals) > limit or _masks_index(template, flat):
        return

    def lowers() -> bool:  # the call as a node, for asking whether its rule lowers it
        return to_jax.traces(node(func, tuple(flat.inputs), template, tuple(out_avals), flat.device, 0))

    check.raise_cpu_error(
        func,
        lambda make: _call_args(template, flat.meta_subst, args, kwargs, make, _CPU),
        random=RULES[func].random if func in RULES else True,
        meta_error=meta_error,
        lowers=lowers if func in RULES and out_avals else None,
    )


def _masks_index(template, flat: _Flat) -> bool:
    """Whether a boolean tensor is among a list argument (``index_put``'s indices): the shapes then depend
    on how many elements the mask selects, which stand-in values cannot know."""
    targs, tkw = template
    for a in (*targs, *(v for _, v in tkw)):
        if type(a) is tuple:
            for e in a:
                if type(e) is In and getattr(flat.meta_subst[e.i], "dtype", None) is torch.bool:
                    return True
    return False


# Signatures of calls about to be decomposed whose CPU check passed (the fast path's keys, else the meta
# cache's): the check runs once per signature.
_checked: set = set()


def _check_before_decomposing(func, args, kwargs, route) -> None:
    """An op without a rule is about to be decomposed into ops that each have their own checks, but the
    op's own checks (a dim out of range for ``aminmax``, ...) would be lost: raise what the CPU raises."""
    if _flags["check_max_elements"] <= 0:
        return
    found = _signature(func, args, kwargs, route[2], route[3])
    if found is not None and found[0] in _checked:
        return
    template, flat = _flatten(func, args, kwargs, place=False)
    key = _meta_key(func, canonical(template), flat)
    try:
        done = key in _checked
    except TypeError:  # an unhashable constant: checked, not remembered
        key, done = None, False
    if not done:
        margs, mkw = _call_args(template, flat.meta_subst, args, kwargs, _meta_tensor, _META)
        with torch._C._DisableFuncTorch(), _no_python_dispatch():
            try:
                out_avals = _spec_avals(func(*margs, **mkw))
            except NotImplementedError:  # no meta kernel: the outputs' size is unknown, so no CPU check
                out_avals = None
            except Exception as e:  # the CPU's error, if it raises too; else the decomposition's own
                _check_on_cpu(func, template, flat, args, kwargs, (), e)
                out_avals = None
        if out_avals is not None:
            _check_on_cpu(func, template, flat, args, kwargs, out_avals)
        if key is not None:
            _remember(_checked, key)
    if found is not None:
        _remember(_checked, found[0])


def _spec_avals(out) -> list:
    avals: list = []
    _spec(out, avals)
    return avals


def _remember(memo: set, key) -> None:
    if len(memo) >= _FAST_LIMIT:  # signatures that keep changing: start over rather than grow forever
        memo.clear()
    memo.add(key)


# Output metadata for ops that PyTorch gives no meta kernel (called with meta tensors).
_MISSING_META = {
    aten.multi_margin_loss_backward.default: lambda g, x, *args, **kwargs: torch.empty_like(x),
    aten.multilabel_margin_loss_backward.default: lambda g, x, *args, **kwargs: torch.empty_like(x),
    **{
        op: _new_values_meta(op)
        for op in (
            aten._fused_adam.tensor_lr,
            aten._fused_adamw.default,
            aten._fused_adamw.tensor_lr,
            aten._fused_sgd.default,
            aten._fused_sgd.tensor_lr,
            aten._fused_adagrad.default,
            aten._fused_adagrad.tensor_lr,
            aten._amp_foreach_non_finite_check_and_unscale.default,
            aten._amp_update_scale.default,
        )
    },
}


def _no_python_dispatch():
    return torch._C._DisableTorchDispatch()


def _build(spec, n, requires_grad=False):
    if type(spec) is int:
        return LazyTensor((n, spec), n.avals[spec])
    if spec[0] == "const":
        return spec[1]
    return spec[0](_build(s, n) for s in spec[1])


def _record_general(func, args, kwargs):
    """Record ``func``; returns the outputs and, for the fast path's cache, how it was recorded."""
    template, flat = _flatten(func, args, kwargs)
    ckey = canonical(template)
    spec, avals = _infer(func, template, ckey, flat, args, kwargs)
    base = op_hash(func, ckey, flat.device)
    random = RULES[func].random
    out = _finish(func, tuple(flat.inputs), template, avals, spec, flat.device, base, random)
    return out, (template, base, spec, avals, random)


def _finish(func, inputs, template, avals, spec, device, base, random):
    if random:
        inputs += ((rng.next_key_leaf(device), 0),)
    n = node(func, inputs, template, avals, device, base)
    if _flags["explain_recompiles"]:
        n.source = diagnostics.user_frame(2)
    _counters["ops_recorded"] += 1
    if type(spec) is int:
        return LazyTensor((n, spec), avals[spec])
    return _build(spec, n)


# ---- the fast path: calls whose arguments are lazyxla tensors and plain constants ----
#
# Such a call is keyed by its signature (op, device, each tensor's aval, each constant, a mark for each
# Python float that becomes a graph input); the first call of a signature goes the general way above
# and leaves its template, hash and output avals here, so later calls skip flattening, canonical
# templates and meta inference.

_F64 = Aval((), torch.float64)
_FLOAT_INPUT = ("float input",)
_CONSTANT_TYPES = frozenset({type(None), str, torch.dtype, torch.layout, torch.memory_format, torch.device})
_fast: dict = {}
_FAST_LIMIT = 100_000


def _arg_signature(a, scalar: bool, sig: list, inputs: list) -> int | None:
    """Append ``a``'s signature (and input, if any); returns its device (-1 for none), None if unusual."""
    t = type(a)
    if t is LazyTensor:
        inputs.append(a._value)
        sig.append(a._aval)
        return a._value[0].device
    if t is float:
        if scalar and a not in _CONST_FLOATS:
            inputs.append((leaf(Leaf.SCALAR, a, _F64, -1), 0))
            sig.append(_FLOAT_INPUT)
        else:
            sig.append((float, a, a == -1))
        return -1
    if t is int or t is bool:
        sig.append((t, a, a == -1))
        return -1
    if t in _CONSTANT_TYPES:
        sig.append(a)
        return -1
    if (t is list or t is tuple) and all(type(e) is int for e in a):
        sig.append((t, tuple([(int, e, e == -1) for e in a])))
        return -1
    return None


def _signature(func, args, kwargs, pos_scalar, kw_scalar):
    sig: list = [id(func)]  # OpOverloads live forever; hashing one runs Python code, hashing an int does not
    inputs: list = []
    device = -1
    for i, a in enumerate(args):
        if type(a) is LazyTensor:  # the common case, inline
            value = a._value
            d = value[0].device
            inputs.append(value)
            sig.append(a._aval)
        else:
            d = _arg_signature(a, i < len(pos_scalar) and pos_scalar[i], sig, inputs)
            if d is None:
                return None
        if d != -1:
            if device == -1:
                device = d
            elif d != device:
                return None
    if kwargs:
        for k in sorted(kwargs):
            sig.append(k)
            d = _arg_signature(kwargs[k], k in kw_scalar, sig, inputs)
            if d is None or (d != -1 and device != -1 and d != device):
                return None
            if d != -1:
                device = d
    if device == -1:
        return None  # no tensor argument: the general path finds the device
    sig.append(device)
    return tuple(sig), tuple(inputs), device


def record(func, args, kwargs, route=None):
    """Record ``func`` applied to ``args``/``kwargs`` as a new node; returns its LazyTensor output(s)."""
    route = route or _routes.get(id(func)) or _route(func)
    found = _signature(func, args, kwargs, route[2], route[3])
    if found is not None:
        sig, inputs, device = found
        entry = _fast.get(sig)
        if entry is not None:
            template, base, spec, avals, random = entry
            return _finish(func, inputs, template, avals, spec, device, base, random)
    out, entry = _record_general(func, args, kwargs)
    if found is not None:
        if len(_fast) >= _FAST_LIMIT:  # shapes that keep changing: start over rather than grow forever
            _fast.clear()
        _fast[found[0]] = entry
    return out


# ---- ops handled here ----


def _materialize(t: LazyTensor, reason: str = "host read"):
    graph.sync_tensors([t], reason=reason)
    raise_if_error(t._value[0])
    return t._value[0].payload


def _to_cpu(t: LazyTensor, dtype: torch.dtype | None = None, reason: str = "host read") -> torch.Tensor:
    arr = _materialize(t, reason)
    metrics.inc("device_to_host")
    with metrics.timer("transfer"):
        out = runtime.to_host(arr, t.dtype)
    return out if dtype is None or dtype == out.dtype else out.to(dtype)


def _from_cpu(t: torch.Tensor, device: int) -> LazyTensor:
    metrics.inc("host_to_device")
    aval = Aval(tuple(t.shape), t.dtype)
    with metrics.timer("transfer"):
        arr = runtime.to_device(t, device)
    n = leaf(Leaf.DATA, arr, aval, device)
    n.source = f"copied from the CPU at {diagnostics.user_frame(2)}"
    return LazyTensor((n, 0), aval)


def _alias(t: LazyTensor) -> LazyTensor:
    return LazyTensor(t._value, t._aval)


def _copy(dst, src, non_blocking=False):
    if isinstance(src, LazyTensor) and src._value[0].device == dst._value[0].device:
        if src.shape == dst.shape and src.dtype == dst.dtype:
            return _alias(src)
        return record(aten.copy.default, (dst, src), {})
    if isinstance(src, LazyTensor):  # another lazyxla device
        src = _to_cpu(src, reason="copy between lazyxla devices")
    host = src.to(dst.dtype).expand(dst.shape).contiguous()
    return _from_cpu(host, dst._value[0].device)


def _to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    if device is not None and torch.device(device).type != "lazyxla":
        return _to_cpu(x, dtype, ".cpu() / .to(cpu)").to(device)
    target = x._value[0].device if device is None else (torch.device(device).index or 0)
    if target != x._value[0].device:
        # Functionalization does not wrap the result of a copy to another device (it assumes the copy
        # leaves the functional world, as .cpu() does), so the new lazyxla tensor is wrapped here.
        return wrap(_from_cpu(_to_cpu(x, dtype), target))
    if dtype is None or dtype == x.dtype:
        return _alias(x)
    return record(aten._to_copy.default, (x,), {"dtype": dtype})


# Per thread: how many PyTorch decompositions are running here, below functionalization. A factory they call
# (``torch.tensor(0, device=x.device)`` in ``_linspace_from_neg_one``) must give them a bare LazyTensor.
_nested = threading.local()
_FUNCTIONALIZE = torch._C.DispatchKey.Functionalize


def _lift(fresh):
    """``aten.lift_fresh`` / ``lift`` (and ``lift_fresh_copy`` on a copy): the last step of ``torch.tensor``,
    ``as_tensor``, ``asarray`` and ``Tensor.new_tensor`` with ``device=``. PyTorch builds that tensor with
    functionalization switched off, so ``fresh`` is a bare LazyTensor, and leaves it to the device's lift
    kernel to put it under functionalization (torch_xla's wraps it there too). Handed to the user bare, it
    fails in ``.tolist()`` and in any in-place op mixing it with ordinary lazyxla tensors ("mutating a
    non-functional tensor with a functional tensor"). It stays bare where functionalization wraps it itself
    (its mode is on: the key is in the thread's include set) and inside a decomposition running here."""
    if getattr(_nested, "depth", 0) or torch._C._dispatch_tls_is_dispatch_key_included(_FUNCTIONALIZE):
        return fresh
    return wrap(fresh)


def _decomposed(decomp, args, kwargs):
    _nested.depth = getattr(_nested, "depth", 0) + 1
    try:
        return decomp(*args, **kwargs)
    finally:
        _nested.depth -= 1


# PyTorch checks random_'s bounds in its CPU/CUDA kernels, not in the meta kernels that record an op: without
# this, torch.randint(0, 5, dtype=torch.bool, device=dev) drew numbers where PyTorch raises. The bounds are
# checked by PyTorch's own CPU kernel on an empty scratch tensor (no draw; a private generator, so never the
# user's CPU stream), which raises its exceptions and warnings, word for word, at the user's call.
_SCRATCH_GENERATOR = torch.Generator()
_RANDOM_BOUNDS = {  # op -> (x, *args, **kwargs) -> (dtype, from, to) as random_ takes them
    getattr(aten.random, "from"): lambda x, from_, to=None, **_: (x.dtype, from_, to),
    aten.random.to: lambda x, to, **_: (x.dtype, 0, to),
    aten.randint_like.default: lambda x, high, *, dtype=None, **_: (dtype or x.dtype, 0, high),
    aten.randint_like.low_dtype: lambda x, low, high, *, dtype=None, **_: (dtype or x.dtype, low, high),
}


def _random_bounds_checked(func):
    bounds = _RANDOM_BOUNDS[func]

    def handler(*args, **kwargs):
        dtype, from_, to = bounds(*args, **kwargs)
        torch.empty(0, dtype=dtype).random_(from_, to, generator=_SCRATCH_GENERATOR)
        return record(func, args, kwargs)

    return handler


def _local_scalar_dense(x):
    return _to_cpu(x, reason=".item()").item()


def _batch_norm_updating_stats(x, w, b, running_mean, running_var, training, momentum, eps):
    # Batch norm in training mode updates the running statistics in place; native_batch_norm's schema
    # does not say so, and _native_batch_norm_legit arrives here only below functionalization (from a
    # decomposition). Record the functional variant and rebind the statistics.
    args = (x, w, b, running_mean, running_var, training, momentum, eps)
    out = record(aten._native_batch_norm_legit_functional.default, args, {})
    running_mean._value, running_var._value = out[3]._value, out[4]._value
    return out[:3]


def _eval_batch_norm(x, w, b, running_mean, running_var, momentum, eps):
    # In eval mode PyTorch's CPU kernel returns empty saved statistics; the meta kernel says (C,).
    out = record(
        aten._native_batch_norm_legit_no_training.default, (x, w, b, running_mean, running_var, momentum, eps), {}
    )
    kw = {"dtype": out[1].dtype, "device": torch.device("lazyxla", x._value[0].device)}
    empty = record(aten.empty.memory_format, ([0],), kw)
    return out[0], empty, _alias(empty)


def _native_batch_norm(x, w, b, running_mean, running_var, training, momentum, eps):
    if not training and running_mean is not None:
        return _eval_batch_norm(x, w, b, running_mean, running_var, momentum, eps)
    if not training or running_mean is None:
        return record(aten.native_batch_norm.default, (x, w, b, running_mean, running_var, training, momentum, eps), {})
    return _batch_norm_updating_stats(x, w, b, running_mean, running_var, training, momentum, eps)


def _native_batch_norm_legit(x, w, b, running_mean, running_var, training, momentum, eps):
    if not training:
        return _eval_batch_norm(x, w, b, running_mean, running_var, momentum, eps)
    return _batch_norm_updating_stats(x, w, b, running_mean, running_var, training, momentum, eps)


def _native_batch_norm_legit_functional(x, w, b, running_mean, running_var, training, momentum, eps):
    if not training:  # functionalization's form of _native_batch_norm_legit in eval mode
        y, save_mean, save_rstd = _eval_batch_norm(x, w, b, running_mean, running_var, momentum, eps)
        return y, save_mean, save_rstd, _alias(running_mean), _alias(running_var)
    args = (x, w, b, running_mean, running_var, training, momentum, eps)
    return record(aten._native_batch_norm_legit_functional.default, args, {})


def _nonzero(x):
    """``nonzero``'s output shape depends on the data: the input is synced and its nonzero count read
    on the host (counted as the ``data_dependent_syncs`` metric), then ``nonzero_static`` of that size
    is recorded, so the result stays on the device."""
    count = record(aten.count_nonzero.default, (x,), {})
    graph.sync_tensors([x, count], reason="data-dependent shape (nonzero)")
    metrics.inc("data_dependent_syncs")
    return record(aten.nonzero_static.default, (x,), {"size": int(_to_cpu(count).item())})


def _single_sample_loss(func, single):
    """PyTorch's CPU margin losses give a 0-d loss for one sample (``single(input, target)``) with
    reduction='none'; their meta kernels say shape (1,). The loss is recorded, then viewed as 0-d."""

    def handler(*args, **kwargs):
        out = record(func, args, kwargs)
        loss = out[0] if type(out) is tuple else out
        if single(args[0], args[1]) and loss.dim() == 1:
            loss = record(aten.view.default, (loss, []), {})
            return (loss, *out[1:]) if type(out) is tuple else loss
        return out

    return handler


_SPECIAL = {
    aten.multi_margin_loss.default: _single_sample_loss(aten.multi_margin_loss.default, lambda x, t: t.dim() == 0),
    aten.multilabel_margin_loss_forward.default: _single_sample_loss(
        aten.multilabel_margin_loss_forward.default, lambda x, t: x.dim() <= 1
    ),
    aten.native_batch_norm.default: _native_batch_norm,
    aten._native_batch_norm_legit.default: _native_batch_norm_legit,
    aten._native_batch_norm_legit_functional.default: _native_batch_norm_legit_functional,
    aten.nonzero.default: _nonzero,
    aten.copy.default: _copy,
    aten._to_copy.default: _to_copy,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.lift_fresh.default: _lift,
    aten.lift.default: _lift,
    aten.detach.default: _alias,
    aten.alias.default: _alias,
    aten.clone.default: lambda x, memory_format=None: _alias(x),
    aten.detach_copy.default: _alias,
    aten.alias_copy.default: _alias,
    aten.lift_fresh_copy.default: lambda x: _lift(_alias(x)),
}


_SPECIAL.update({func: _random_bounds_checked(func) for func in _RANDOM_BOUNDS})

SPECIAL_OPS = frozenset(_SPECIAL)


# ---- decompositions, in-place ops below functionalization, foreach, CPU fallback ----


@functools.cache
def _core_decompositions() -> dict:
    return torch._decomp.core_aten_decompositions()


@functools.cache
def _decomposition(func):
    # Only decompositions into core aten ops: the general table also holds refs that lower to prims.
    table = _core_decompositions()
    if func in table:
        return table[func]
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        return func.decompose
    return None


@functools.cache
def _functional_of(func):
    """For an in-place op ``aten.x_.ov``: the functional ``aten.x.ov`` and the mutated arg positions."""
    schema = func._schema
    base = schema.name.split("::")[1]
    if not base.endswith("_") or base.startswith("_foreach"):
        return None
    packet = getattr(aten, base[:-1], None)
    overload = getattr(packet, func._overloadname, None) if packet is not None else None
    if overload is None:
        return None
    return overload


@functools.cache
def _functional_of_out(func):
    """``aten.x.out``-style overload -> the overload of ``aten.x`` with the same non-out arguments."""
    schema = func._schema
    want = [a.name for a in schema.arguments if not a.is_out]
    packet = getattr(aten, schema.name.split("::")[1])
    for name in packet.overloads():
        cand = getattr(packet, name)
        if not cand._schema.is_mutable and [a.name for a in cand._schema.arguments] == want:
            return cand
    return None


def _out_variant(func, args, kwargs):
    """An ``out=`` op below functionalization (from a decomposition): compute, then rebind ``out``."""
    functional = _functional_of_out(func)
    outs = [kwargs[a.name] for a in func._schema.arguments if a.is_out and a.name in kwargs]
    if functional is None:  # the CPU runs it into CPU copies of out: their values come back below
        result = _fallback(func, args, kwargs)
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
        o._value = r._value
    return outs[0] if len(outs) == 1 else tuple(outs)


def _inplace(func, functional, args, kwargs):
    out = dispatch(functional, args, kwargs)
    args[0]._value = out._value
    return args[0]


_ELEMENT_OVERLOADS = {
    "Scalar": ("Scalar", "Tensor_Scalar", "default", "Tensor"),
    "ScalarList": ("Scalar", "Tensor_Scalar", "default", "Tensor"),
    "List": ("Tensor", "default", "Tensor_Tensor"),
    "Tensor": ("Tensor", "default", "Tensor_Tensor"),
    "default": ("default",),
    "ScalarAndTensor": ("Scalar",),
}


_FOREACH_CLAMPS = {"maximum": aten.clamp_min.default, "minimum": aten.clamp_max.default}


@functools.cache
def _foreach_element_op(func):
    """``aten._foreach_x.ov`` -> the per-tensor op ``aten.x.<matching overload>`` (or None)."""
    name = func._schema.name.split("::")[1][len("_foreach_") :].rstrip("_")
    if name == "norm":
        return aten.linalg_vector_norm.default
    if name in _FOREACH_CLAMPS and func._overloadname in ("Scalar", "ScalarList"):
        return _FOREACH_CLAMPS[name]  # aten.maximum takes no number: a tensor's maximum with one is clamp_min
    packet = getattr(aten, name, None)
    if packet is None:
        return None
    names = [ov for ov in _ELEMENT_OVERLOADS.get(func._overloadname, ()) if ov in packet.overloads()]
    candidates = [getattr(packet, ov) for ov in names]
    # the first whose arguments take one element of each foreach argument: pow.Tensor_Scalar for
    # _foreach_pow.Scalar (pow.Scalar takes the number first), clamp_min.default for _foreach_clamp_min.Scalar
    types = [a.type for a in func._schema.arguments]
    want = [str(t.getElementType() if isinstance(t, torch.ListType) else t) for t in types]
    for op in candidates:
        have = [str(a.type) for a in op._schema.arguments]
        if have[: len(want)] == want:
            return op
    return candidates[0] if candidates else None


def _foreach(func, args, kwargs):
    """``_foreach_x(lists...)``: ``x`` applied to each element, arguments matched by schema position."""
    op = _foreach_element_op(func)
    if op is None:
        return None
    fnames = [a.name for a in func._schema.arguments]
    bound = list(args) + [kwargs[n] for n in fnames[len(args) :] if n in kwargs]
    if op is aten.linalg_vector_norm.default:  # (self, ord, dtype) -> (self, ord, dim, keepdim, dtype)
        bound = bound[:2] + [None, False] + bound[2:]
    params = op._schema.arguments[: len(bound)]
    lists = next(b for b in bound if isinstance(b, (list, tuple)))
    results = []
    for i in range(len(lists)):
        pos, kw = [], {}
        for p, b in zip(params, bound):
            v = b[i] if isinstance(b, (list, tuple)) else b
            if p.kwarg_only:
                kw[p.name] = v
            else:
                pos.append(v)
        results.append(dispatch(op, tuple(pos), kw))
    if func._schema.name.endswith("_"):
        for t, r in zip(args[0], results):
            t._value = r._value
        return None
    return results


_NO_RULE = "has no lowering rule nor decomposition"


def _fallback(func, args, kwargs, why: str = _NO_RULE):
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
    lazies = [a for a in _leaves(args, kwargs) if isinstance(a, LazyTensor)]
    graph.sync_tensors(lazies, reason=f"fallback {name}")
    if lazies:
        device = lazies[0]._value[0].device

    def to_cpu(x):
        if isinstance(x, LazyTensor):
            return _to_cpu(x)
        if isinstance(x, (list, tuple)):
            return type(x)(to_cpu(e) for e in x)
        if isinstance(x, torch.device) and x.type == "lazyxla":
            return torch.device("cpu")
        return x

    out = func(*to_cpu(args), **{k: to_cpu(v) for k, v in kwargs.items()})

    def back(x):
        if isinstance(x, torch.Tensor):
            return _from_cpu(x, device or 0)
        if isinstance(x, (list, tuple)):
            return type(x)(back(e) for e in x)
        return x

    return back(out)


def _leaves(args, kwargs):
    stack = list(args) + list(kwargs.values())
    while stack:
        x = stack.pop()
        if isinstance(x, (list, tuple)):
            stack.extend(x)
        else:
            yield x


# Ops the device's own kernels take before any dispatch here (factories, empty, copies): filled by _core.
DEVICE_KERNEL_OPS: set = set()


def status_of(func) -> str:
    """How lazyxla runs ``func``: 'rule', 'special', 'kernel', 'decomposition', 'functionalized' or
    'fallback'."""
    if func in _SPECIAL:
        return "special"
    if func in DEVICE_KERNEL_OPS:
        return "kernel"
    if func in RULES:
        return "rule"
    if func._schema.name.startswith("aten::_foreach_") and _foreach_element_op(func) is not None:
        return "decomposition"
    if _functional_of(func) is not None or (
        func._schema.is_mutable and any(a.is_out for a in func._schema.arguments) and _functional_of_out(func)
    ):
        return "functionalized"
    if _decomposition(func) is not None:
        return "decomposition"
    return "fallback"


def _check_devices(args, kwargs) -> None:
    """Raise PyTorch's device-mismatch error for a non-0-dim tensor that is not on lazyxla."""
    devices = set()
    for x in _leaves(args, kwargs):
        if isinstance(x, LazyTensor):
            devices.add(x._value[0].device)
        elif isinstance(x, torch.Tensor) and x.dim() != 0:
            raise DeviceMismatch(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"lazyxla:{min(devices, default=0)} and {x.device}! Move the tensor with .to(lazyxla.device())."
            )
    if len(devices) > 1:
        a, b = sorted(devices)[:2]
        raise DeviceMismatch(
            "Expected all tensors to be on the same device, but found at least two devices, "
            f"lazyxla:{a} and lazyxla:{b}!"
        )


# id(op) -> (special handler or None, whether it has a rule, Scalar positions, Scalar keyword names):
# one int-keyed lookup per op instead of several dict lookups that each hash the OpOverload in Python.
_routes: dict = {}


def _route(func) -> tuple:
    route = (_SPECIAL.get(func), func in RULES, *_scalar_args(func))
    _routes[id(func)] = route
    return route


def dispatch(func, args, kwargs):
    route = _routes.get(id(func)) or _route(func)
    special = route[0]
    if special is not None:
        return special(*args, **kwargs)
    why = _NO_RULE
    if route[1]:
        try:
            return record(func, args, kwargs, route)
        except _NoMeta:
            why = "has an output shape that depends on the data (or no meta kernel) for these arguments"
    _check_devices(args, kwargs)
    if func._schema.name.startswith("aten::_foreach_") and _foreach_element_op(func) is not None:
        return _foreach(func, args, kwargs)
    functional = _functional_of(func)
    if functional is not None:
        return _inplace(func, functional, args, kwargs)
    if func._schema.is_mutable and any(a.is_out for a in func._schema.arguments):
        return _out_variant(func, args, kwargs)
    decomp = _decomposition(func)
    if decomp is not None:
        _check_before_decomposing(func, args, kwargs, route)
        out = _decomposed(decomp, args, kwargs)
        if out is not NotImplemented:
            return out
    return _fallback(func, args, kwargs, why)


set_dispatch(dispatch)  # every op on a LazyTensor comes here (tensor.py cannot import this module)
