"""Errors at the call, as PyTorch's CPU kernels raise them.

The recorder learns an op's output shapes and dtypes from PyTorch's meta kernels, but many meta kernels
skip checks that the CPU kernels make: a dtype the op does not take (``bitwise_and`` on floats), mixed
dtypes (``float32 @ int64`` in ``mm``/``addmm``), a dim out of range (``_softmax(x2d, -3)``), a
convolution's dilation <= 0. Left to the meta kernel, such a call records happily and then fails in the
lowering at the sync, far from the user's line, or silently computes something PyTorch refuses.

So the first time the recorder meets a call signature (when it runs the meta kernel, whose result it
memoizes), it also runs PyTorch's CPU kernel once on stand-in inputs of the same shapes and dtypes, and
raises what the CPU raises, at the call. Later calls of the signature hit the memo and cost nothing. When
a meta kernel raises, the CPU kernel decides the exception (meta kernels written in Python sometimes
raise another type than the CPU, an ``AssertionError`` for a ``RuntimeError``).

Only what holds for every value is raised: the stand-ins are ones, then zeros, and an error is raised
only if both raise (an integer division by zero or an index past a dim of size 1 depends on the
values); linear-algebra errors (``LinAlgError``: a singular matrix) always depend on the values. Nor are
the CPU's own gaps raised: a dtype its kernels lack (half precision, float8, wide unsigned ints) or an op
with no CPU kernel is legal on an accelerator. Calls larger than ``config.check_max_elements`` elements
(inputs and outputs together) are not run on the CPU: it would cost a CPU step; their meta kernel's
checks still apply.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

import torch

from lazyxla import torch_private
from lazyxla.ir import Aval
from lazyxla.util import Memo

# NotImplementedError ('"<kernel>" not implemented for '<dtype>'', an accelerator-only op whose CPU kernel is
# a stub), or a message that names the CPU ("nansum on CPU does not support complex inputs"). Either no
# device takes the call (bitwise_and on floats) or only the CPU build lacks it (abs on bool, nansum on
# complex, some ops in half precision, _scaled_dot_product_fused_attention_overrideable): the lowering rule
# tells which.
_CPU_GAP = re.compile(r"not implemented for '\w+'|\bCPU\b|\bon cpu\b")
# No CPU kernel at all (an accelerator-only op).
_NO_CPU_KERNEL = re.compile(r"Could not run '[\w:.]+' with arguments from the 'CPU' backend")
# A TORCH_CHECK without a message: "Expected dim < ... to be true, but got false. (Could this error message
# be improved? ...)". PyTorch's other devices raise a worded error there (narrow_copy: IndexError).
_UNWORDED = re.compile(r"Could this error message be improved\?")

_NOTE = (
    "lazyxla: PyTorch's CPU kernel raises this for the call's shapes and dtypes (lazyxla runs each new call "
    "signature once on the CPU to raise PyTorch's errors at the call); set lazyxla.config.check_max_elements "
    "= 0 to turn the check off if it is wrong."
)


def numel(avals) -> int:
    """Elements of all ``avals`` together."""
    total = 0
    for a in avals:
        n = 1
        for d in a.shape:
            n *= d
        total += n
    return total


# Half-precision dtypes and the dtype accelerators keep their statistics in (see _cpu_error).
_WIDER = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.complex32: torch.complex64}


def _stand_in(fill: int, widen: bool, seen: set) -> Callable[[Aval], torch.Tensor]:
    """Stand-in tensors filled with ``fill`` (half precision widened to float32 if ``widen``)."""

    def make(aval: Aval) -> torch.Tensor:
        seen.add(aval.dtype)
        dtype = _WIDER.get(aval.dtype, aval.dtype) if widen else aval.dtype
        return torch.full(aval.shape, bool(fill) if dtype == torch.bool else fill, dtype=dtype)

    return make


def _run(func, build, make, random: bool) -> BaseException | None:
    """What ``func(*build(make))`` raises on the CPU (None if it returns, or if stand-ins cannot be made)."""
    try:
        args, kwargs = build(make)
    except Exception:  # a dtype torch.full cannot make: nothing to check against
        return None
    state = torch.random.get_rng_state() if random else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            func(*args, **kwargs)
        return None
    except Exception as e:
        return _without_tracebacks(e)
    finally:
        if random:  # the check must not move the user's CPU random stream
            torch.random.set_rng_state(state)


def _without_tracebacks(error: BaseException) -> BaseException:
    """``error`` with the tracebacks of its whole chain dropped (it is raised again without one).

    A kept traceback holds this check's frames, and through them the call's lazyxla tensors (``build`` closes
    over the arguments), in a reference cycle that only the garbage collector frees: until then a full sync
    finds those tensors alive and computes them as extra outputs (and the first sync's ``gc.freeze()`` kept
    them for good)."""
    stack, seen = [error], set()
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        stack += [e.__cause__, e.__context__]
    return error


def _cpu_error(func, build, random: bool, meta_error: BaseException | None, lowers) -> BaseException | None:
    """What PyTorch's CPU kernel raises for ``func(*build(make))`` with every stand-in fill (None if a fill
    passes, or if the error is the CPU's gap or depends on the values). When the meta kernel raised
    already, the CPU's error replaces it (PyTorch's native kernels word their errors alike on every device;
    meta kernels written in Python differ, even in type), unless it is an unworded internal check.

    A call with half-precision inputs that passes with them widened to float32 is not refused either: the
    meta kernels follow accelerators, which keep half-precision statistics in float32 (layer norm's mean
    and rstd), and the CPU kernels of the backward then refuse the mix ("expected scalar type BFloat16 but
    found Float") although no device ever computes it otherwise."""
    seen: set = set()
    first = None
    for fill in (1, 0):
        e = _run(func, build, _stand_in(fill, False, seen), random)
        if e is None or isinstance(e, torch.linalg.LinAlgError):
            return None
        msg = str(e)
        gap = isinstance(e, NotImplementedError) or _CPU_GAP.search(msg)
        if _NO_CPU_KERNEL.search(msg) or (gap and (lowers is None or lowers())):
            return None
        if meta_error is not None and _UNWORDED.search(msg):
            return None
        first = first or e
    if seen & _WIDER.keys() and _run(func, build, _stand_in(1, True, set()), random) is None:
        return None
    return first


# Ops whose CPU kernel checks the other inputs against the values of length tensors (CTC: the concatenated
# targets' size is the sum of the target lengths): stand-ins of ones and zeros are not the call's lengths, so what
# their CPU kernel raises says nothing about the call.
_LENGTHS_AS_TENSORS = frozenset({torch.ops.aten._ctc_loss.Tensor, torch.ops.aten._ctc_loss_backward.Tensor})


def raise_cpu_error(func, build, *, random: bool = False, meta_error: BaseException | None = None, lowers=None) -> None:
    """Raise what PyTorch's CPU kernel raises for ``func`` on stand-ins of the call's inputs, if it raises.

    ``build(make)`` returns the call's ``(args, kwargs)`` with each tensor input made by ``make(aval)``;
    ``random``: the op draws from the CPU generator (its state is restored); ``meta_error``: what the meta
    kernel raised, if it did; ``lowers()``: whether lazyxla's rule computes the call (None: an op without
    a rule, whose CPU dtype gaps are the ops' it decomposes into, each checked itself).
    Example: ``raise_cpu_error(aten.mm.default, lambda make: ((make(a), make(b)), {}))`` raises
    ``RuntimeError: expected m1 and m2 to have the same dtype`` for float32 ``a`` and int64 ``b``.
    """
    if func in _LENGTHS_AS_TENSORS:
        return
    with torch_private.disable_functorch(), torch_private.disable_torch_dispatch():
        err = _cpu_error(func, build, random, meta_error, lowers)
    if err is not None:
        err.add_note(_NOTE)
        raise err.with_traceback(None)


def raise_cpu_error_instead(func, args: tuple, kwargs: dict, error: BaseException, limit: int) -> None:
    """Raise, in place of ``error``, what PyTorch's CPU kernel raises for ``func(*args, **kwargs)`` on stand-ins
    of its tensors, if it raises (``limit``: the most elements the CPU kernel is run on, 0 for none); else
    return, and the caller raises ``error``.

    Called only once a call has failed: an in-place op reaches PyTorch's Python decompositions (``torch._refs``,
    meta kernels), which word errors otherwise than the native kernels every device shares, or raise another
    type: ``x.clamp_()`` raises ``RuntimeError: At least one of 'min' or 'max' must not be None`` as on the
    CPU, not the reference's ``ValueError``.
    """
    tensors = [x for x in torch_private.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    if limit <= 0 or numel([Aval(tuple(t.shape), t.dtype) for t in tensors]) > limit:
        return

    def build(make):
        return _standin_args(args, make), {k: _standin_args(v, make) for k, v in kwargs.items()}

    # only an error that does not depend on the values (the same for both fills: a mask's count does)
    with torch_private.disable_functorch(), torch_private.disable_torch_dispatch():
        errors = [_run(func, build, _stand_in(fill, False, set()), True) for fill in (1, 0)]
    first, second = errors
    if first is None or second is None or (type(first), str(first)) != (type(second), str(second)):
        return
    msg = str(first)
    if (
        isinstance(first, NotImplementedError)
        or _UNWORDED.search(msg)
        or _CPU_GAP.search(msg)
        or _NO_CPU_KERNEL.search(msg)
    ):
        return  # an internal check, or the CPU's own gap: the original error says more
    first.add_note(_NOTE)
    raise first.with_traceback(None)


# ---- out= calls: functionalization turns them into the functional op and a copy into ``out``, so the
# out= kernel's own checks (``out``'s dtype: gather, amax, multinomial, complex, ...) never run ----

# out= call signatures already checked: shapes that keep changing would grow it forever, so the oldest leave past
# 100,000 (each entry a few shapes and dtypes)
_out_checked = Memo("lazyxla.lazy.check._out_checked", limit=100_000)


def _out_signature(x):
    if isinstance(x, torch.Tensor):
        return (x.shape, x.dtype)  # torch.Size hashes as the tuple it is
    if type(x) is list or type(x) is tuple:
        return tuple([_out_signature(e) for e in x])
    return x


def _standin_args(x, make):
    if isinstance(x, torch.Tensor):
        return make(Aval(tuple(x.shape), x.dtype))
    if isinstance(x, (list, tuple)):
        return type(x)(_standin_args(e, make) for e in x)
    if isinstance(x, torch.device):
        return torch.device("cpu")
    return x


def check_out_call(func, args, kwargs, limit: int) -> None:
    """Raise what PyTorch's CPU out= kernel ``func`` raises for this call's shapes and dtypes (once per
    signature; ``limit``: the most elements the CPU kernel is run on, 0 for none).

    Example: ``torch.amax(x_float32, 0, out=y_int32)`` raises ``RuntimeError: Expected the dtype for input
    and out to match`` at the call, where functionalization would have computed float32 and cast it.
    """
    if limit <= 0:
        return
    # kwargs come in schema order
    sig = (func, _out_signature(args), tuple([(k, _out_signature(v)) for k, v in kwargs.items()]))
    try:
        if sig in _out_checked.table:
            return
    except TypeError:  # an unhashable argument: checked every time
        sig = None
    tensors = [x for x in torch_private.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    masks = any(  # a boolean index in a list (index_put's indices): shapes depend on the mask's values
        isinstance(e, torch.Tensor) and e.dtype == torch.bool
        for a in (*args, *kwargs.values())
        if isinstance(a, (list, tuple))
        for e in a
    )
    if not masks and numel([Aval(tuple(t.shape), t.dtype) for t in tensors]) <= limit:
        raise_cpu_error(
            func,
            lambda make: (_standin_args(args, make), {k: _standin_args(v, make) for k, v in kwargs.items()}),
            random=True,  # out= ops include normal, bernoulli, multinomial, randint...: keep the CPU stream
        )
    if sig is not None:
        _out_checked.remember(sig)
