"""Functionalization's meta check of in-place ops, memoized: one dict lookup instead of PyTorch's Python.

Why
---
Before functionalization turns an in-place op on a lazyxla tensor (``p.add_(g, alpha=-lr)``) into its functional
variant, it runs the in-place op on meta tensors, to raise the errors only the in-place form has (a result that
cannot be broadcast or cast into ``self``). For ~170 in-place ops PyTorch's Meta kernel is Python:
``torch._meta_registrations`` registers its reference implementations over the C++ ones, so each check runs
PyTorch's type promotion and broadcasting code in Python (~25-60 µs). An optimizer step checks every parameter:
Adam's ``_foreach_lerp_``, ``_foreach_addcmul_`` and ``_foreach_addcdiv_`` check each tensor one by one. On a
small GPT's training step these checks were a third of lazy mode's host time (70 -> 45 ms of CPU per step).

What
----
Each of those kernels is wrapped (``install()``): a call whose signature passed the check before returns
``self`` at once; any other call runs PyTorch's kernel, and its signature is remembered when it returns.
Errors are raised by PyTorch's kernel as before, and never remembered. The signature holds, per argument:
a tensor's sizes, strides and dtype; an int, bool or string's value; a float's or complex's *type* only for the
arithmetic ops whose checks never read a number (``_NUMBERS_UNREAD``: an optimizer's step size changes every
step), and its value for every other op (``uniform_(a, b)`` checks ``a <= b``). A call with symbolic sizes (a
fake tensor under ``torch.compile``'s tracing) or an argument of another kind is not memoized. The wrap applies
to every caller of those Meta kernels in the process, and changes nothing a caller can see.

Example::

    install()                                   # done by lazyxla's registration, once
    p.add_(g, alpha=-0.1)                       # first call of this signature: PyTorch's check runs
    p.add_(g, alpha=-0.2)                       # same sizes, dtypes and number types: no Python check
"""

from __future__ import annotations

import torch

from lazyxla import torch_private
from lazyxla.util import Memo

# in-place arithmetic whose meta checks read only sizes, strides, dtypes and the *types* of Python numbers
_NUMBERS_UNREAD = frozenset(
    "add_ sub_ mul_ div_ addcmul_ addcdiv_ lerp_ fill_ masked_fill_ clamp_ clamp_min_ clamp_max_ pow_".split()  # noqa: SIM905
)
# in-place arithmetic whose Python meta kernel forgets the check that the result's dtype casts into ``self``'s
# (PyTorch's C++ kernels raise "result type Float can't be cast to the desired output type Long"; its meta
# kernels, and so functionalization, let ``long_tensor.mul_(float_tensor)`` through): operands by position
_RESULT_CAST = {"add_": 2, "sub_": 2, "mul_": 2, "div_": 2, "addcmul_": 3}
_PASSED = Memo("lazyxla.frontend.inplace_checks._PASSED", limit=50_000)  # signatures that passed a check
_NOT_MEMOIZED = object()
_Tensor = torch.Tensor
_installed = False


def _arg_key(a, numbers_unread: bool):
    t = type(a)
    if isinstance(a, torch.Tensor):
        return (a.shape, a.stride(), a.dtype, a.layout)  # unhashable if symbolic (``kernel`` checks it then)
    if t is float or t is complex:
        return t if numbers_unread else (t, a)
    if t is int or t is bool or t is str or a is None:
        return (t, a)
    if t in (list, tuple):
        keys = tuple(_arg_key(e, numbers_unread) for e in a)
        return _NOT_MEMOIZED if any(k is _NOT_MEMOIZED for k in keys) else (t, keys)
    if t is torch.dtype or t is torch.memory_format or t is torch.layout:
        return a
    return _NOT_MEMOIZED  # a Generator, a SymInt, a device...: run PyTorch's check


def _signature(op_id: int, numbers_unread: bool, args: tuple, kwargs: dict):
    key = [op_id]
    for a in args:
        if type(a) is _Tensor:  # the common case (functionalization's meta copies), inline; symbolic sizes
            key.append((a.shape, a.stride(), a.dtype, a.layout))  # make the key unhashable (``kernel``)
            continue
        k = _arg_key(a, numbers_unread)
        if k is _NOT_MEMOIZED:
            return None
        key.append(k)
    for name in sorted(kwargs):
        k = _arg_key(kwargs[name], numbers_unread)
        if k is _NOT_MEMOIZED:
            return None
        key.append((name, k))
    return tuple(key)


def _check_result_cast(name: str, operands: tuple) -> None:
    result = torch_private.elementwise_result_dtype(*operands)
    if name == "div_" and not (result.is_floating_point or result.is_complex):
        result = torch.get_default_dtype()  # true division
    if not torch.can_cast(result, operands[0].dtype):
        raise RuntimeError(
            f"result type {_short(result)} can't be cast to the desired output type {_short(operands[0].dtype)}"
        )


def _short(dtype: torch.dtype) -> str:
    return {
        torch.float32: "Float",
        torch.float64: "Double",
        torch.int64: "Long",
        torch.int32: "Int",
        torch.float16: "Half",
        torch.bfloat16: "BFloat16",
        torch.bool: "Bool",
        torch.int16: "Short",
        torch.int8: "Char",
        torch.uint8: "Byte",
        torch.complex64: "ComplexFloat",
        torch.complex128: "ComplexDouble",
    }.get(dtype, str(dtype))


def memoized(op, check):
    """``check`` (``op``'s Meta kernel, which returns ``self`` or raises) remembering the signatures that passed.

    Example::

        kernel = memoized(torch.ops.aten.add_.Tensor, meta_binop_inplace_alpha)
        kernel(meta_a, meta_b, alpha=2.0)        # PyTorch's check, then remembered
    """
    op_id = id(op)  # OpOverloads live forever; hashing one runs Python code
    passed = _PASSED.table
    name = op._schema.name.split("::")[1]
    numbers_unread = name in _NUMBERS_UNREAD
    operands = _RESULT_CAST.get(name, 0)

    def kernel(*args, **kwargs):
        key = _signature(op_id, numbers_unread, args, kwargs)
        try:
            if key is not None and key in passed:
                return args[0]
        except TypeError:  # a symbolic size (torch.compile's tracing) cannot be hashed: check every call
            key = None
        out = check(*args, **kwargs)
        if operands:
            _check_result_cast(name, args[:operands])
        if key is not None:
            _PASSED.remember(key)
        return out

    kernel.__name__ = getattr(check, "__name__", "meta_check")
    kernel.__wrapped__ = check
    return kernel


def install() -> None:
    """Memoize PyTorch's Python Meta kernels of in-place ops (``torch_private.python_inplace_meta_kernels``).

    Example::

        install()    # idempotent
    """
    global _installed
    if _installed:
        return
    _installed = True
    for op, check in torch_private.python_inplace_meta_kernels():
        torch_private.replace_meta_kernel(op, memoized(op, check))
