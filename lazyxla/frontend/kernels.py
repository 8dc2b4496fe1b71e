"""Glue between PyTorch's device hooks and the lazy layer: factory and copy kernels, seeding."""

from __future__ import annotations

import functools
import math
import warnings

import torch

from lazyxla import torch_private
from lazyxla.config import config
from lazyxla.device import devices
from lazyxla.device.devices import on_device
from lazyxla.frontend import autocast, layout, modules, optimizers, registration, storage
from lazyxla.lazy import check, rng, subclass_relay
from lazyxla.lazy.graph import wait_device_ops
from lazyxla.lazy.meta import record
from lazyxla.lazy.record import DEVICE_KERNEL_OPS
from lazyxla.lazy.special import copy_into, lazy_to_cpu
from lazyxla.lazy.tensor import LazyTensor, dispatch_op, set_value, unwrap, wrap
from lazyxla.lowering.rules import attention
from lazyxla.util import Memo

aten = torch.ops.aten
_flags = config._values  # read per out= call: a dict lookup, not lazyxla.config's attribute hook
# per call: True inside functionalization (or our own dispatch), where kernels return bare LazyTensors
_below_functionalization = torch_private.below_functionalization


def _rewrap(x):
    if isinstance(x, LazyTensor):
        return wrap(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_rewrap(e) for e in x)
    return x


def _unwrap_all(x):
    if isinstance(x, torch.Tensor) and on_device(x):
        return unwrap(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap_all(e) for e in x)
    return x


def _empty(size, dtype=None, device=None):
    dtype = dtype or torch.get_default_dtype()
    index = 0 if device is None else (torch.device(device).index or 0)
    devices.jax_device(index)  # raises a clear error for a device that does not exist
    kw = {"dtype": dtype, "device": devices.torch_device(index)}
    lt = record(aten.empty.memory_format, (list(size),), kw, fresh=True)
    return lt if _below_functionalization() else wrap(lt)


def _backend_kernel(op, *args, **kwargs):
    """Every op that reaches the lazyxla backend key: factories (no lazyxla tensor argument) and
    ``out=`` ops below functionalization."""
    args, kwargs = _unwrap_all(args), {k: _unwrap_all(v) for k, v in kwargs.items()}
    result = dispatch_op(op, args, kwargs)  # the installed handler: the recorder, or eager mode around it
    return result if _below_functionalization() else _rewrap(result)


def _empty_memory_format(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _empty(size, dtype, device)


def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    """``torch.empty_strided``: a value of ``size``; where ``stride`` spans more elements than that (gaps between
    them, ``empty_strided((2, 3), (1, 4))``), an ``as_strided`` view of a base of the span, so that its storage has
    the CPU's size (``storage().size()``, and ``as_strided`` bounds checks against it)."""
    span = _strided_span(size, stride)
    if span <= math.prod(size) or _below_functionalization():
        return _empty(size, dtype, device)
    return _empty((span,), dtype, device).as_strided(size, stride)


def _strided_span(size, stride) -> int:
    """The elements a CPU storage holds for ``size``/``stride`` (ATen's computeStorageNbytes, in elements)."""
    if any(n == 0 for n in size):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(size, stride))


def _copy_from(src, dst, non_blocking=False):
    if on_device(dst):
        inner = unwrap(dst)
        new = copy_into(inner, unwrap(src) if on_device(src) else src)
        set_value(inner, new._value)
        return dst
    dst.copy_(lazy_to_cpu(unwrap(src), reason="copy_ to a CPU tensor"))
    return dst


def to_cpu(t: torch.Tensor, reason: str = "print") -> torch.Tensor:
    with torch.no_grad():
        return lazy_to_cpu(unwrap(t), reason=reason)


KERNELS = {
    "aten::empty.memory_format": _empty_memory_format,
    "aten::empty_strided": _empty_strided,
    "aten::_copy_from": _copy_from,
}
# Factories recorded whole: their CompositeExplicit kernels would write into a resized out= tensor
# (arange, ...) or record two ops where one does (rand, randn: empty, then an in-place draw).
_FACTORIES = (
    "eye",
    "eye.m",
    "logspace",
    "arange",
    "arange.start",
    "arange.start_step",
    "range",  # its CompositeExplicit kernel resized an empty out= tensor on the CPU
    "range.step",
    "full",
    "scalar_tensor",
    "linspace",
    "randperm",
    "rand",
    "randn",
    "kaiser_window",  # its CompositeExplicit kernel calls a per-device DispatchStub, which lazyxla has not
    "kaiser_window.periodic",
    "kaiser_window.beta",
)


def _overload(name: str):
    """``aten.<op>.<overload>`` for ``"op"`` or ``"op.overload"`` (an ``aten::`` prefix is allowed)."""
    op, _, overload = name.removeprefix("aten::").partition(".")
    return getattr(getattr(aten, op), overload or "default")


# ``torch.tensor(storage)`` (PyTorch's C++) makes ``empty(0, device=storage.device)`` with the Python and
# Functionalize keys excluded -- a bare LazyTensor -- and ``set_``s it to the storage, so the in-place ``set_`` reaches
# the backend key instead of LazyTensor's __torch_dispatch__. PyTorch's Python-kernel trampoline then looks the op up
# among the per-op Python kernels, and a fallback (``_backend_kernel`` for every other op) is not one: "func !=
# nullptr INTERNAL ASSERT". These per-op kernels are found: the LazyTensor takes the value ``set`` records (the
# storage's values, lazy/special.py) and the shape PyTorch's Meta kernel gives it.


def _set_storage_in_place(self, source, storage_offset=0, size=None, stride=None):
    """``aten.set_.source_Storage(_storage_offset)`` on a bare LazyTensor (the comment above)."""
    functional = aten.set.source_Storage if size is None else aten.set.source_Storage_storage_offset
    args = (self, source) if size is None else (self, source, storage_offset, size, stride)
    out = dispatch_op(functional, args, {})
    torch_private.restride_as(self, source, out.storage_offset(), out.shape, out.stride())
    self._value, self._aval = out._value, out._aval
    return self


KERNELS["aten::set_.source_Storage"] = _set_storage_in_place
KERNELS["aten::set_.source_Storage_storage_offset"] = _set_storage_in_place
for _name in _FACTORIES:
    KERNELS["aten::" + _name] = functools.partial(_backend_kernel, _overload(_name))


# rand recorded whole skipped the CPU kernel's dtype check: ``torch.rand(3, dtype=torch.int64)`` raises on the CPU
# ('"check_uniform_bounds" not implemented for 'Long'') and gave random integers on lazyxla. The CPU raises it for
# an empty size too, so one empty draw on the CPU per dtype finds it. (randn of an integer dtype raises before
# reaching here.)
_DRAWS = {"rand": torch.rand}
# (name, dtype) -> the CPU's error, or None: a few draws times PyTorch's few dozen dtypes
_dtype_errors = Memo("lazyxla.frontend.kernels._dtype_errors", limit=1_000)


def _checked_draw(name: str, op):
    def kernel(*args, **kwargs):
        dtype = kwargs.get("dtype") or torch.get_default_dtype()
        error = _dtype_errors.table.get((name, dtype), False)
        if error is False:
            try:
                _DRAWS[name](0, dtype=dtype)
                error = _dtype_errors.remember((name, dtype), None)
            except RuntimeError as e:  # NotImplementedError is one
                error = _dtype_errors.remember((name, dtype), e)
        if error is not None:
            raise type(error)(str(error))
        return _backend_kernel(op, *args, **kwargs)

    return kernel


KERNELS["aten::rand"] = _checked_draw("rand", _overload("rand"))


def _scaled_dot_product_attention(
    q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """``F.scaled_dot_product_attention`` on lazyxla tensors: one fused op (lowered in rules/attention.py,
    backward included) instead of PyTorch's ~20-op math decomposition. Dropout, grouped-query broadcast,
    inputs that are not 4-d, and ``sdpa_kernel`` disabling the fused kernels take PyTorch's own path.
    ``config.sdpa_implementation='cudnn'`` raises here for a call cuDNN cannot take."""
    fused = (
        torch_private.overrideable_sdpa_enabled()
        and not dropout_p
        and q.dim() == k.dim() == v.dim() == 4
        and q.shape[1] == k.shape[1] == v.shape[1]
        and not (is_causal and attn_mask is not None)  # PyTorch rejects the pair; its kernel says how
    )
    rejected = is_causal and attn_mask is not None  # PyTorch's own error below says why
    if config.sdpa_implementation == "cudnn" and not rejected:  # raise here, at the call, not at the compile
        if not fused:
            raise ValueError(
                "lazyxla.config.sdpa_implementation is 'cudnn' (LAZYXLA_SDPA_IMPLEMENTATION), but this attention "
                "call takes PyTorch's math path (it has dropout, grouped-query heads or inputs that are not 4-d, "
                "or torch.nn.attention.sdpa_kernel leaves out the fused backend); set it to 'auto' or 'xla'"
            )
        attention.choose(q.shape, k.shape, v.shape, str(q.dtype).removeprefix("torch."), attn_mask is not None)
    if not fused:
        return aten.scaled_dot_product_attention.default.decompose(
            q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(~attn_mask, -math.inf)
    out = aten._scaled_dot_product_fused_attention_overrideable(
        q, k, v, attn_mask, dropout_p, is_causal, False, scale=scale
    )
    return out[0]


_is_view = torch_private.is_view  # per in-place op: one C call

# PyTorch's own autograd kernel of copy_ (VariableType's, the same for every backend), taken before
# lazyxla registers its own at AutogradPrivateUse1 below.
_AUTOGRAD_COPY = torch_private.computed_kernel("aten::copy_", "AutogradPrivateUse1")


def _copy_(keyset, self, src, non_blocking=False):
    """``aten::copy_`` at AutogradPrivateUse1: ``cpu_tensor.copy_(lazyxla_tensor)`` reads the value to the
    host and copies it there. (PyTorch's functionalization rejects a functional source copied into a
    plain tensor, with an exception only for XLA's own device type.) Every other copy_ runs PyTorch's
    autograd kernel unchanged."""
    if not on_device(self) and on_device(src):
        return self.copy_(src.to(self.device), non_blocking)
    if _is_view(self):  # an expanded view: PyTorch's internal-overlap error (frontend/layout.py)
        layout.check_written(aten.copy_.default, (self, src, non_blocking), {}, (self,))
    if on_device(src) and (_is_view(self) or _is_view(src)):  # y[:9].copy_(y[1:10]): PyTorch's overlap error
        layout.check_inputs(aten.copy_.default, (self, src, non_blocking), {}, (self,), (src,))
    return _AUTOGRAD_COPY.call_boxed(keyset, self, src, non_blocking)


_copy_.with_keyset = True

_AUTOGRAD_AS_STRIDED_SCATTER = torch_private.computed_kernel("aten::as_strided_scatter", "AutogradPrivateUse1")


def _as_strided_scatter(keyset, self, src, size, stride, storage_offset=None):
    """``aten::as_strided_scatter`` at AutogradPrivateUse1: PyTorch's internal-overlap error for a layout whose
    elements share memory, as the CPU raises it, then PyTorch's autograd kernel. (The recorder lets that error pass:
    functionalization writes an overlapping ``as_strided`` view back to its base with this op, below autograd.)"""
    layout.check_scatter_layout(size, stride, storage_offset)
    return _AUTOGRAD_AS_STRIDED_SCATTER.call_boxed(keyset, self, src, size, stride, storage_offset)


_as_strided_scatter.with_keyset = True


def _allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """``torch.allclose`` on lazyxla tensors: PyTorch's own composite, which every backend without a kernel of
    its own runs (torch_xla's device included): ``isclose`` (its ops recorded one by one, each a program of its
    own in eager mode), ``all``, and one host read of the answer. Below autograd, lazyxla's dispatch saw the
    whole op, which has no lowering rule, and ran it on the CPU."""
    return bool(torch.isclose(self, other, rtol, atol, equal_nan).all().item())


# ``reshape`` and ``contiguous`` copy a view whose layout does not allow the result as a view (``x.t().reshape(-1)``,
# ``x.t().contiguous()``). PyTorch decides on the strides the tensor reports, and a lazyxla wrapper reports
# contiguous ones whatever view it is: both returned a view of ``x``, and a write through it changed ``x``, where
# the CPU's copy leaves ``x`` alone. Here the decision is taken on the view's CPU layout (frontend/layout.py,
# memoized per view chain; a tensor that is no view costs one C call): ``reshape`` by a kernel at
# AutogradPrivateUse1, ``contiguous`` in ``Tensor.contiguous`` itself (PyTorch's binding returns a tensor that
# reports contiguous strides without dispatching).


def _reshape(self, shape):
    """``aten::reshape`` on lazyxla tensors: a copy where the CPU copies (``_unsafe_view`` of a contiguous clone,
    PyTorch's own copy path), PyTorch's composite kernel otherwise."""
    if _is_view(self) and layout.copies_on_reshape(self, shape):
        return aten._unsafe_view(self.clone(memory_format=torch.contiguous_format), shape)
    return aten.reshape.default.decompose(self, shape)


def _flatten(self, start_dim=0, end_dim=-1):
    """``aten::flatten.using_ints`` on lazyxla tensors: a copy where the CPU copies (PyTorch's kernel calls its
    reshape directly, not through the dispatcher), PyTorch's composite kernel otherwise."""
    nd = self.dim()
    if _is_view(self) and nd and -nd <= start_dim < nd and -nd <= end_dim < nd and start_dim % nd < end_dim % nd:
        s, e = start_dim % nd, end_dim % nd
        shape = (*self.shape[:s], math.prod(self.shape[s : e + 1]), *self.shape[e + 1 :])
        if layout.copies_on_reshape(self, shape):
            return aten._unsafe_view(self.clone(memory_format=torch.contiguous_format), shape)
    return aten.flatten.using_ints.decompose(self, start_dim, end_dim)


def _ravel(self):
    """``aten::ravel`` on lazyxla tensors: ``contiguous().view(-1)`` as PyTorch's kernel, with ``contiguous`` as
    the CPU decides it (PyTorch's C++ ``contiguous`` trusts the wrapper's contiguous strides)."""
    if _is_view(self) and layout.copies_on_contiguous(self):
        return self.clone(memory_format=torch.contiguous_format).view(-1)
    return aten.ravel.default.decompose(self)


def _copying_contiguous(contiguous):
    """``Tensor.contiguous`` that clones a lazyxla view that is not contiguous on the CPU, PyTorch's otherwise."""

    @functools.wraps(contiguous)
    def checked(self, memory_format=torch.contiguous_format):
        if (
            memory_format == torch.contiguous_format
            and _is_view(self)
            and on_device(self)
            and layout.copies_on_contiguous(self)
        ):
            return self.clone(memory_format=torch.contiguous_format)
        return contiguous(self, memory_format=memory_format)

    checked._lazyxla = True
    return checked


# torch.optim's fused=True calls in-place ops (``_fused_adamw_(params, grads, exp_avgs, ...)``) whose
# functionalization kernels, as PyTorch generates them, count an empty list argument as "not functional":
# ``max_exp_avg_sqs`` without amsgrad and SGD's momentum buffers without momentum are empty, so the step tripped
# PyTorch's INTERNAL ASSERT "mutating a non-functional tensor with a functional tensor" (and _fused_sgd_ and
# _fused_adagrad_ have no meta kernel for functionalization's shape check). On lazyxla tensors these kernels,
# above functionalization, run the functional form (one recorded node: lowering/rules/optim.py) and copy each
# new list into the list it replaces; functionalization handles both. A tensor subclass of its own (a DTensor: its
# device is lazyxla, so its calls pass here) gets the in-place op, PyTorch's autograd kernel on: it runs the op on
# its local tensors, which come back here (DTensor's sharding propagation of the functional form fails in torch
# 2.13: "should be a list[TensorMeta]").
_FUSED_STEPS = (
    "_fused_adam_",
    "_fused_adam_.tensor_lr",
    "_fused_adamw_",
    "_fused_adamw_.tensor_lr",
    "_fused_sgd_",
    "_fused_sgd_.tensor_lr",
    "_fused_adagrad_",
    "_fused_adagrad_.tensor_lr",
)


def _fused_step(name: str):
    inplace = _overload(name)
    functional = getattr(getattr(aten, inplace._schema.name.split("::")[1][:-1]), inplace._overloadname)
    arguments = inplace._schema.arguments
    written = [i for i, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write]
    grads = [a.name for a in arguments].index("grads")
    original = torch_private.computed_kernel(f"aten::{name}", "AutogradPrivateUse1")

    def step(*args, **kwargs):
        new = functional(*args, **kwargs)
        for i, values in zip(written, new):
            # the kernels write the gradients only to unscale them: without grad_scale they are unchanged
            # (and copying them would refresh every view of them)
            if len(values) and (i != grads or kwargs.get("grad_scale") is not None):
                torch_private.foreach_copy_(args[i], values)

    def kernel(keyset, *args, **kwargs):
        if _subclass_of_its_own(args[0]):
            return original.call_boxed(keyset, *args, **kwargs)
        step(*args, **kwargs)

    # over replicas DTensor runs the in-place op on its local tensors (user's tensors), relayed below autograd,
    # where this kernel is not: the relay runs the same functional form and copies (lazy/subclass_relay.py)
    subclass_relay.relay_as(inplace, step)
    kernel.__name__ = kernel.__qualname__ = name.replace(".", "_")
    kernel.with_keyset = True
    return kernel


def _subclass_of_its_own(tensors) -> bool:
    """Whether the first of ``tensors`` is a tensor subclass with a dispatch of its own, other than lazyxla's (a
    DTensor; not a Parameter)."""
    first = tensors[0] if tensors else None
    dispatch = getattr(type(first), "__torch_dispatch__", None)
    return dispatch not in (None, torch.Tensor.__torch_dispatch__) and not isinstance(first, LazyTensor)


_AUTOGRAD_BLOCK_DIAG = torch_private.computed_kernel("aten::block_diag", "AutogradPrivateUse1")


def _block_diag(keyset, tensors):
    """``torch.block_diag`` at AutogradPrivateUse1: PyTorch's own checks of its inputs, in its order and words
    (TensorShape.cpp), before lazyxla's recorder met a CPU input and raised its generic device-mismatch error;
    then PyTorch's autograd kernel."""
    for i, t in enumerate(tensors):
        if t.dim() > 2:
            raise RuntimeError(
                f"torch.block_diag: Input tensors must have 2 or fewer dimensions. Input {i} has {t.dim()} dimensions"
            )
        if t.device != tensors[0].device:
            raise RuntimeError(
                "torch.block_diag: input tensors must all be on the same device. Input 0 is on device "
                f"{tensors[0].device} and input {i} is on device {t.device}"
            )
    return _AUTOGRAD_BLOCK_DIAG.call_boxed(keyset, tensors)


_block_diag.with_keyset = True


# ``x.view(dtype)`` is no autograd view (its ``_base`` is None, as on the CPU), so the base its functionalization
# view chain starts from is kept when it is made (frontend/layout.py): ``data_ptr`` then gives it the CPU's address
# (``x[1:].view(torch.int16)`` starts where ``x[1:]`` does). PyTorch's check of the storage offset for a larger
# element size read the wrapper's offset, 0 for every view; it is made on the CPU's.
_original_view_dtype = torch_private.computed_kernel("aten::view.dtype", "AutogradPrivateUse1")


def _view_dtype(keyset, self, dtype):
    """``aten::view.dtype`` at AutogradPrivateUse1: the CPU's storage-offset check, PyTorch's kernel, and the
    view's base noted for its CPU layout."""
    layout.check_view_dtype(self, dtype)
    view = _original_view_dtype.call_boxed(keyset, self, dtype)
    layout.note_dtype_view(view, self)
    return view


_view_dtype.with_keyset = True


AUTOGRAD_KERNELS = {
    "view.dtype": _view_dtype,
    "block_diag": _block_diag,
    "scaled_dot_product_attention": _scaled_dot_product_attention,
    "allclose": _allclose,
    "copy_": _copy_,
    "as_strided_scatter": _as_strided_scatter,
    "reshape": _reshape,
    "flatten.using_ints": _flatten,
    "ravel": _ravel,
    **{name: _fused_step(name) for name in _FUSED_STEPS},
}


# ``out=`` calls: functionalization runs the functional op and copies the result into ``out``, so an
# out= kernel's own checks (``out``'s dtype for gather, amax, multinomial, ...) never run on lazyxla and
# the value was silently cast. A kernel at AutogradPrivateUse1 for every aten out= overload asks the CPU
# out= kernel once per call signature (``check.check_out_call``), then runs PyTorch's own autograd kernel
# (taken before the override; the same as every backend's).


def _out_kernel(name: str, original):
    op = outs = out_positions = out_names = None
    fills_by_numel = name.partition(".")[0] in _FILLS_BY_NUMEL

    def kernel(keyset, *args, **kwargs):
        nonlocal op, outs, out_positions, out_names
        if op is None:  # resolved at the first call: 1100 OpOverloads at import cost ~0.1 s
            op = _overload(name)
            outs = [(i, a.name) for i, a in enumerate(op._schema.arguments) if a.is_out]
            out_positions, out_names = {i for i, _ in outs}, {k for _, k in outs}
        check.check_out_call(op, args, kwargs, _flags["check_max_elements"])
        written = [args[i] if i < len(args) else kwargs.get(k) for i, k in outs]
        if fills_by_numel and (shape := layout.kept_out_shape(op, args, kwargs, written[0])) is not None:
            return _fill_by_numel(keyset, original, op, outs[0], shape, args, kwargs)
        views = any(isinstance(t, torch.Tensor) and _is_view(t) for t in written)
        if views:  # frontend/layout.py
            layout.check_written(op, args, kwargs, written)
        inputs = [a for i, a in enumerate(args) if i not in out_positions]
        inputs += [v for k, v in kwargs.items() if k not in out_names]
        if any(_may_alias(a, written) for a in inputs):  # an input sharing an out= tensor's memory (the CPU's
            layout.check_inputs(op, args, kwargs, written, inputs)  # first error, before a resize)
        if views:
            layout.check_out_views(op, args, kwargs, written)
        args, kwargs = _numbers_as_tensors(op, args, kwargs)
        return original.call_boxed(keyset, *args, **kwargs)

    kernel.with_keyset = True
    return kernel


# arange, range, linspace and logspace resize their out= tensor only when its number of elements differs from the
# result's (ATen's RangeFactories.cpp: ``if (result.numel() != size) result.resize_({size})``): ``torch.arange(9,
# out=torch.empty(3, 3))`` keeps the shape (3, 3) and fills it in row-major order, through a view too
# (``out=x.narrow(1, 1, 2)`` writes into ``x``). Functionalization resized it to (9,) (and refused the view): here
# the op runs into a fresh tensor of the result's shape, copied into ``out`` reshaped to ``out``'s shape.
_FILLS_BY_NUMEL = frozenset({"arange", "range", "linspace", "logspace"})


def _fill_by_numel(keyset, original, op, out_at: tuple, shape, args: tuple, kwargs: dict):
    i, name = out_at
    out = args[i] if i < len(args) else kwargs[name]
    fresh_out = torch.empty(shape, dtype=out.dtype, device=out.device)
    if i < len(args):
        args = (*args[:i], fresh_out, *args[i + 1 :])
    else:
        kwargs = {**kwargs, name: fresh_out}
    args, kwargs = _numbers_as_tensors(op, args, kwargs)
    original.call_boxed(keyset, *args, **kwargs)
    with torch.no_grad():  # out= ops do not record autograd (PyTorch refuses an out= that requires grad)
        out.copy_(fresh_out.reshape(out.shape))
    return out


_NUMBER = (bool, int, float, complex)


def _may_alias(a, written: list) -> bool:
    """Whether the argument ``a`` (a tensor or a list of them) may share memory with a tensor of ``written``: it is
    one of them, or a view, or ``written`` holds a view (frontend/layout.py decides)."""
    if isinstance(a, (list, tuple)):
        return any(_may_alias(e, written) for e in a)
    if not isinstance(a, torch.Tensor):
        return False
    return _is_view(a) or any(w is a or (isinstance(w, torch.Tensor) and _is_view(w)) for w in written)


def _numbers_as_tensors(op, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``args``/``kwargs`` with each Python number at a ``Tensor`` position made a 0-d CPU tensor.

    PyTorch's C++ code calls out= ops with numbers wrapped as tensors (``at::mul_out(out, t, 0.25)``, as DDP's
    gradient averaging does); entering a Python kernel turns them back into Python numbers, which a boxed call
    refuses ("Expected a value of type 'Tensor' for argument 'other'"). A wrapped number cannot be rebuilt from
    Python, so the number becomes a 0-d tensor of the dtype PyTorch computes in (its promotion with the other
    inputs, as a wrapped number promotes): the same result, the number exact in that dtype.
    """
    schema = op._schema.arguments
    positions = [i for i, a in enumerate(args[: len(schema)]) if type(a) in _NUMBER and _is_tensor_arg(schema[i])]
    names = {a.name: a for a in schema}
    keys = [k for k, v in kwargs.items() if type(v) in _NUMBER and k in names and _is_tensor_arg(names[k])]
    if not positions and not keys:
        return args, kwargs
    inputs = [a for a, s in zip(args, schema) if isinstance(a, torch.Tensor) and not s.is_out]
    inputs += [v for k, v in kwargs.items() if isinstance(v, torch.Tensor) and k in names and not names[k].is_out]
    dtype = functools.reduce(torch.promote_types, [t.dtype for t in inputs], torch.bool)

    def tensor(number):
        return torch.tensor(number, dtype=torch.result_type(torch.empty(0, dtype=dtype), number))

    args = tuple(tensor(a) if i in positions else a for i, a in enumerate(args))
    return args, {k: tensor(v) if k in keys else v for k, v in kwargs.items()}


def _is_tensor_arg(argument) -> bool:
    return str(argument.type) in ("Tensor", "Optional[Tensor]")


def _out_kernels() -> dict:
    kernels = {}
    for schema in torch_private.all_schemas():
        if not schema.name.startswith("aten::") or not any(a.is_out for a in schema.arguments):
            continue
        name = schema.name.removeprefix("aten::") + ("." + schema.overload_name if schema.overload_name else "")
        if name in AUTOGRAD_KERNELS:
            continue
        original = torch_private.computed_kernel(
            schema.name + ("." + schema.overload_name if schema.overload_name else ""), "AutogradPrivateUse1"
        )
        kernels[name] = _out_kernel(name, original)
    return kernels


AUTOGRAD_KERNELS.update(_out_kernels())

# In-place ops: PyTorch's kernels refuse to write to a tensor whose elements share memory (an expanded view), but
# a lazyxla view's strides are contiguous and functionalization wrote the view's sum back to its base. A kernel at
# AutogradPrivateUse1 for every aten in-place op asks frontend/layout.py when ``self`` is a view (one C call for
# any other tensor), then runs PyTorch's own autograd kernel.


def _inplace_kernel(name: str, original):
    op = tensors = None

    def kernel(keyset, self, *args, **kwargs):
        nonlocal op, tensors
        if op is None:
            op = _overload(name)
            tensors = {a.name for a in op._schema.arguments if _is_tensor_arg(a)}
        if _is_view(self):
            layout.check_written(op, (self, *args), kwargs, (self,))
        _check_inplace_args(op, self, args, kwargs)
        for a in args:
            if type(a) in _NUMBER:  # ``x.add_(1)``: a number C++ wrapped as a tensor
                scalar_op, args, kwargs = _wrapped_numbers(op, tensors, args, kwargs)
                if scalar_op is not op:  # its Scalar overload: dispatched from the top (our kernel of it included)
                    return scalar_op(self, *args, **kwargs)
                break
        try:
            return original.call_boxed(keyset, self, *args, **kwargs)
        except Exception as e:  # a Python decomposition's wording (or type): raise the CPU kernel's, as CUDA does
            check.raise_cpu_error_instead(op, (self, *args), kwargs, e, _flags["check_max_elements"])
            raise

    kernel.with_keyset = True
    return kernel


def _check_inplace_args(op, self, args: tuple, kwargs: dict) -> None:
    """PyTorch's checks of an in-place op's other tensor arguments, which functionalization skips (one pass over
    the arguments; frontend/layout.py asks the meta or CPU kernel only when a shape differs or an argument may
    share ``self``'s memory): ``self`` is never broadcast to a larger shape, and an input overlapping ``self``
    partially (``y[:9].add_(y[1:10])``) is refused."""
    shape, differs = self.shape, False
    aliased = _is_view(self)
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            differs = differs or a.shape != shape
            aliased = aliased or a is self or _is_view(a)
        elif isinstance(a, (list, tuple)):  # index_put_'s indices
            aliased = aliased or any(isinstance(e, torch.Tensor) and (e is self or _is_view(e)) for e in a)
    if differs:
        layout.check_inplace_shape(op, (self, *args), kwargs)
    if aliased:
        layout.check_inputs(op, (self, *args), kwargs, (self,), (*args, *kwargs.values()))


def _wrapped_numbers(op, tensors: set, args: tuple, kwargs: dict) -> tuple:
    """``(op, args, kwargs)`` for a call whose ``args``/``kwargs`` (after ``self``) hold a Python number at a
    ``Tensor`` argument (C++ wrapped it; a Python kernel sees the number, which a boxed call refuses).

    The op's overload that takes a ``Scalar`` there (``add_.Scalar`` for ``add_.Tensor``) computes exactly what the
    wrapped number did (PyTorch's Scalar overloads wrap it) and records it as a Python number. An op without one
    gets ``torch.tensor(number)``: a 0-d tensor promotes as the wrapped number against ``self``, which has dims (the
    dtype's category decides, not its width: ``uint8.add_(300)`` wraps to 45 as on the CPU)."""
    names = [a.name for a in op._schema.arguments[1:]]
    numbers = frozenset(
        [n for n, a in zip(names, args) if type(a) in _NUMBER and n in tensors]
        + [k for k, v in kwargs.items() if type(v) in _NUMBER and k in tensors]
    )
    scalar_op = _scalar_overload(op, numbers)
    if scalar_op is not None:
        return scalar_op, args, kwargs
    args = tuple(torch.tensor(a) if type(a) in _NUMBER and n in numbers else a for n, a in zip(names, args))
    return op, args, {k: torch.tensor(v) if k in numbers else v for k, v in kwargs.items()}


# (op, names of its Tensor arguments given numbers) -> its Scalar overload, or None: a few entries per op used
_scalar_overloads = Memo("lazyxla.frontend.kernels._scalar_overloads", limit=20_000)


def _scalar_overload(op, names: frozenset):
    key = (op, names)
    if key not in _scalar_overloads.table:
        want = [(a.name, "number" if a.name in names else str(a.type)) for a in op._schema.arguments]  # Scalar
        packet = getattr(aten, op._schema.name.removeprefix("aten::"))
        found = None
        for overload in packet.overloads():
            other = getattr(packet, overload)
            if [(a.name, str(a.type)) for a in other._schema.arguments] == want:
                found = other
        return _scalar_overloads.remember(key, found)
    return _scalar_overloads.table[key]


def _writes_self(schema) -> bool:
    """An aten op that writes its first argument, a single tensor, and no out= argument: ``add_``, ``normal_``."""
    args = schema.arguments
    return (
        schema.name.startswith("aten::")
        and schema.name.endswith("_")
        and not schema.name.startswith("aten::_foreach_")
        and bool(args)
        and str(args[0].type) == "Tensor"
        and args[0].alias_info is not None
        and args[0].alias_info.is_write
        and not any(a.is_out for a in args)
    )


def _inplace_kernels() -> dict:
    kernels = {}
    for schema in torch_private.all_schemas():
        name = schema.name.removeprefix("aten::") + ("." + schema.overload_name if schema.overload_name else "")
        if not _writes_self(schema) or name in AUTOGRAD_KERNELS or schema.name in _METADATA_INPLACE:
            continue
        qualified = schema.name + ("." + schema.overload_name if schema.overload_name else "")
        try:
            original = torch_private.computed_kernel(qualified, "AutogradPrivateUse1")
        except RuntimeError:  # a TorchScript builtin (aten::_no_grad_normal_): no dispatcher op to override
            continue
        if torch.Tag.inplace_view in _overload(name).tags:  # t_, squeeze_, as_strided_: a view's metadata
            continue
        kernels[name] = _inplace_kernel(name, original)
    return kernels


# in-place ops that change what a tensor is, not its elements' values
_METADATA_INPLACE = frozenset(
    {"aten::set_", "aten::resize_", "aten::resize_as_", "aten::detach_", "aten::requires_grad_"}
)

AUTOGRAD_KERNELS.update(_inplace_kernels())

# PyTorch's functionalization kernel of ``aten::_to_copy`` (what ``Tensor.to(dtype)``, ``.float()``,
# ``.bfloat16()`` run) wraps its result again only for the XLA and Lazy device types; for any other device it
# returns the bare inner tensor ("the functionalization pass ends there"). On lazyxla that handed the user a
# bare LazyTensor, which later fails in any in-place op mixing it with ordinary lazyxla tensors (e.g.
# ``x.bfloat16().masked_fill_(mask, 0)``: "mutating a non-functional tensor with a functional tensor"), and
# autocast casts every matmul input this way. This kernel, at Functionalize, runs PyTorch's and wraps a
# lazyxla result.

_FUNCTIONAL_TO_COPY = torch_private.computed_kernel("aten::_to_copy", "Functionalize")


def _to_copy(keyset, self, **kwargs):
    out = _FUNCTIONAL_TO_COPY.call_boxed(keyset, self, **kwargs)
    if on_device(out) and not torch_private.is_functional(out):
        out = torch_private.to_functional(out)
    return out


# ``pack_padded_sequence`` returns ``batch_sizes`` on the CPU, which the recurrent modules' kernels read on the
# host (``data_ptr``). PyTorch's functionalization kernel wraps every output of an op on a lazyxla tensor, that CPU
# tensor too, and a wrapper has no data to read ("its data is not allocated yet"): this kernel, at Functionalize,
# runs PyTorch's and hands back the plain CPU tensor, as CUDA's ``pack_padded_sequence`` gives it.

_FUNCTIONAL_PACK_PADDED = torch_private.computed_kernel("aten::_pack_padded_sequence", "Functionalize")


def _pack_padded_sequence(keyset, input, lengths, batch_first):
    data, batch_sizes = _FUNCTIONAL_PACK_PADDED.call_boxed(keyset, input, lengths, batch_first)
    if torch_private.is_functional(batch_sizes) and not on_device(batch_sizes):
        batch_sizes = torch_private.from_functional(batch_sizes)
    return data, batch_sizes


_functionalize_library = None


def install(name: str = "lazyxla") -> None:
    """Register the device with PyTorch under ``name`` (``"lazyxla"``, or ``"xla"`` for torch_xla's code) and
    install every PyTorch hook lazyxla needs (once: later calls change nothing)."""
    registration.register(KERNELS, rng, _backend_kernel, AUTOGRAD_KERNELS, wait_device_ops, name)
    DEVICE_KERNEL_OPS.update(_overload(name) for name in KERNELS)
    registration.patch_printing(to_cpu)
    rng.manual_seed(torch.initial_seed())
    global _functionalize_library
    if _functionalize_library is None:
        _functionalize_library = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():  # "overriding a previously registered kernel": PyTorch's, on purpose
            warnings.simplefilter("ignore", UserWarning)
            _functionalize_library.impl("_to_copy", _to_copy, "Functionalize", with_keyset=True)
            _functionalize_library.impl(
                "_pack_padded_sequence", _pack_padded_sequence, "Functionalize", with_keyset=True
            )
    if not getattr(torch.Tensor.contiguous, "_lazyxla", False):
        torch.Tensor.contiguous = _copying_contiguous(torch.Tensor.contiguous)
    autocast.install()
    modules.install()
    storage.install()
    optimizers.install()


__all__ = ["LazyTensor", "install", "to_cpu"]
