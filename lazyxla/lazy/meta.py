"""Recording one op as an IR node: its arguments flattened, its outputs inferred, and the fast path.

``record(func, args, kwargs)`` turns a call into a node of the graph (see ``lazy.ir``) and returns its
LazyTensor outputs. The first call of a signature flattens the arguments into a hashable template and
its inputs (Python numbers that are tensor math become graph inputs; 0-d CPU tensors are moved to the
device), infers the outputs with PyTorch's meta kernels (memoized by op, template and input avals) and
checks the call against PyTorch's CPU kernel (``lazy.check``); later calls of that signature take the
fast path, which skips all three. Which ops get here is decided by ``lazy.record.dispatch``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import torch

from lazyxla import torch_private
from lazyxla.config import config
from lazyxla.device import devices, processes
from lazyxla.ir import Aval, In, Leaf, canonical, leaf, node, op_hash, slot
from lazyxla.lazy import check, growth, rng
from lazyxla.lazy.session import session as _session  # (read per op: the growth check's next count)
from lazyxla.lazy.tensor import LazyTensor
from lazyxla.lowering import to_jax
from lazyxla.lowering.registry import RULES
from lazyxla.observe import diagnostics, metrics
from lazyxla.observe.metrics import _counters
from lazyxla.util import Memo

_flags = config._values  # read per op: a dict lookup, not lazyxla.config's attribute hook

aten = torch.ops.aten

# How an argument's Python numbers are recorded (``scalar_args``): constants of the program, or graph inputs
# that change without a recompile (DESIGN.md decision 4). Decided by the op's schema: only ``Scalar`` arguments
# (and numbers passed as ``Tensor``) are tensor math; ``int``/``SymInt`` ones are shapes, sizes, dims and
# positions, and a bool is never an input.
BAKED = 0  # every value is a constant
FLOATS = 1  # Python floats are inputs (0 and +-1 stay constants); ints stay constants
NUMBERS = 2  # floats as above, and every Python int is an input too
COEFFICIENT = 3  # NUMBERS, but the ints 0 and +-1 stay constants (see ``scalar_args``)

# Python numbers in these ops stay constants: they decide output shapes (arange, ...) or select the
# algorithm (a norm's ord), so a graph input would not do.
_CONST_SCALAR_OPS = frozenset(
    {"aten::arange", "aten::linspace", "aten::logspace", "aten::range", "aten::linalg_vector_norm"}
)
# ``Scalar`` arguments whose Python ints stay constants: an int selects how the op computes (PyTorch's exact
# integer powers, a norm's or a margin loss's order), which a graph input cannot do.
_INT_SELECTS = frozenset(
    {
        ("aten::pow", "exponent"),
        ("aten::float_power", "exponent"),
        ("aten::norm", "p"),
        ("aten::dist", "p"),
        ("aten::renorm", "p"),
        ("aten::multi_margin_loss", "p"),
        ("aten::multi_margin_loss_backward", "p"),
    }
)
# Python floats in these ops that stay constants: 0 and +-1 simplify the program. Not in a multi-process run
# (``_spans``): there a rank-dependent value (``x * float(rank)``) would give the ranks different programs, which
# met in their collectives with wrong numbers.
_CONST_FLOATS = frozenset({0.0, 1.0, -1.0})
_spans = processes.programs_span_processes  # [bool], read per number: set once the run's processes joined
# Ints that stay constants in a coefficient (a ``Scalar`` with a numeric default: alpha, beta, a fill value):
# 1 drops a multiply and ``beta=0`` ignores the input, NaNs included.
_CONST_INTS = frozenset({0, 1, -1})
_F64 = Aval((), torch.float64)  # a Python float input (packed in a float64 vector)
_I64_AVAL = Aval((), torch.int64)  # a Python int input (packed in an int64 vector: every int64 exactly)
_I64 = (-(2**63), 2**63 - 1)  # ints outside int64 stay constants: PyTorch's own error (or wrap) then applies
# Ops whose ``float`` arguments are tensor math too, not only their ``Scalar`` ones: the fused optimizer steps
# take the learning rate and betas as ``float``, and a schedule (or OneCycleLR's momentum) changes them per step.
_FLOAT_INPUT_OPS = frozenset({"aten::_fused_adam", "aten::_fused_adamw", "aten::_fused_sgd", "aten::_fused_adagrad"})


class DeviceMismatch(RuntimeError):
    """An op's tensors are on different devices (raised with PyTorch's message)."""


class NoMeta(Exception):
    """PyTorch cannot infer the op's output shape without the data: it runs like an op without a rule."""


def _is_scalar_type(t) -> bool:
    """Argument types where a Python number is tensor math (``Scalar``, or a number passed as ``Tensor``)."""
    if isinstance(t, (torch.NumberType, torch.TensorType)):
        return True
    if isinstance(t, torch.OptionalType):
        return _is_scalar_type(t.getElementType())
    if isinstance(t, torch.ListType):
        return _is_scalar_type(t.getElementType())
    return False


@functools.cache
def scalar_args(func) -> tuple[tuple[int, ...], dict[str, int]]:
    """How each positional and keyword argument of ``func`` records Python numbers: ``BAKED``, ``FLOATS``,
    ``NUMBERS`` or ``COEFFICIENT`` (keyword arguments not listed are ``BAKED``).

    Example: ``scalar_args(aten.add.Tensor)`` is ``((NUMBERS, NUMBERS), {"alpha": COEFFICIENT})``: in
    ``t + step`` the int ``step`` is a graph input, ``alpha=1`` a constant.
    """
    schema = func._schema
    if schema.name in _CONST_SCALAR_OPS:
        return (), {}
    floats = schema.name in _FLOAT_INPUT_OPS

    def kind(a) -> int:
        if _is_scalar_type(a.type):
            if (schema.name, a.name) in _INT_SELECTS:
                return FLOATS
            numeric_default = a.has_default_value() and type(a.default_value) in (int, float)
            return COEFFICIENT if numeric_default else NUMBERS
        return FLOATS if floats and isinstance(a.type, torch.FloatType) else BAKED

    pos = tuple(kind(a) for a in schema.arguments if not a.kwarg_only)
    kw = {a.name: kind(a) for a in schema.arguments if a.kwarg_only and kind(a) != BAKED}
    return pos, kw


def _int_input(v: int, kind: int) -> bool:
    """Whether the Python int ``v`` in an argument of this kind is a graph input (else a constant)."""
    return (
        kind >= NUMBERS and _I64[0] <= v <= _I64[1] and not (kind == COEFFICIENT and v in _CONST_INTS and not _spans[0])
    )


def int_range(v: int) -> tuple:
    """A class of ints that PyTorch's value checks treat alike: sign and bit lengths, which decide whether it
    fits an integer dtype (uint8 takes -255 to 255, int8 -128 to 127) and whether it is 0 (integer division).

    Meta inference and the CPU check run once per class, with the value that class was first seen with,
    so an int input that overflows its op's dtype still raises PyTorch's error at the call.

    Example: ``int_range(127) == int_range(100)`` but ``int_range(128) != int_range(127)``.
    """
    return (v < 0, v.bit_length(), (~v).bit_length() if v < 0 else 0)


# Python numbers that one call hands to many ops: a foreach op's scalar argument, the same number for each
# tensor of its lists (AdamW's ``1 - beta1``, ``eps``, ...). While ``shared_scalars`` holds them, each is one
# graph input however many ops it feeds, not one per tensor: every input costs the program a slice and a
# reshape (the GPT benchmark's step had 343 of them, 240 repeating 5 numbers). Which numbers share an input is the
# caller's choice (lazy.decompose.foreach: each non-list argument, and the equal numbers of a list).
# id(number) -> (number, its leaf); None outside ``shared_scalars`` (a ContextVar: it holds in this thread only, while
# autograd's thread or a loader's records its own ops)
_shared: contextvars.ContextVar[dict | None] = contextvars.ContextVar("lazyxla_shared_scalars", default=None)


@contextlib.contextmanager
def shared_scalars(numbers):
    """Inside: each Python number of ``numbers`` (the objects themselves) records as one graph input, shared by
    every op it is passed to.

    Example::

        with shared_scalars([eps]):                 # lazy.decompose.foreach: one input for eps, not one per tensor
            outs = [dispatch(aten.add.Scalar, (t, eps), {}) for t in tensors]
    """
    token = _shared.set({id(x): (x, None) for x in numbers if type(x) is float or type(x) is int})
    try:
        yield
    finally:
        _shared.reset(token)


def _scalar_leaf(x, aval: Aval):
    """The graph input for Python number ``x``: a new leaf, or the one ``x`` shares (``shared_scalars``)."""
    shared = _shared.get()
    if shared is None or id(x) not in shared:
        return leaf(Leaf.SCALAR, x, aval, -1)
    obj, made = shared[id(x)]
    if made is None:
        made = leaf(Leaf.SCALAR, x, aval, -1)
        shared[id(x)] = (obj, made)
    return made


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
                f"{devices.torch_device(self.device)} and {devices.torch_device(n.device)}!"
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
        if scalar and type(x) is float and (x not in _CONST_FLOATS or _spans[0]):
            return self._add((_scalar_leaf(x, _F64), 0), _F64, x)
        if type(x) is int and _int_input(x, scalar):
            return self._add((_scalar_leaf(x, _I64_AVAL), 0), _I64_AVAL, x)
        return x

    def host_tensor(self, t: torch.Tensor):
        if t.dim() != 0 or t.is_meta:  # a meta tensor: the op runs on meta (``record._on_meta``)
            raise DeviceMismatch(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"{devices.torch_device(self.device or 0)} and {t.device}! Move the tensor with .to(lazyxla.device()) "
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
    pos_scalar, kw_scalar = scalar_args(func)
    flat = _Flat()
    targs = tuple(flat.conv(a, pos_scalar[i] if i < len(pos_scalar) else BAKED) for i, a in enumerate(args))
    # keyword arguments in sorted order, their inputs too: the fast path (``_signature``) lists a call's inputs in
    # that order, and inputs taken in the caller's order (addmm's beta before alpha) swapped two scalars' values
    tkw = tuple((k, flat.conv(kwargs[k], kw_scalar.get(k, BAKED))) for k in sorted(kwargs))
    if flat.device is None:
        flat.device = _device_kwarg(kwargs)
    if not place:
        return (targs, tkw), flat
    for i, (value, aval) in enumerate(zip(flat.inputs, flat.avals)):
        if type(value[0]) is _Pending0d:
            metrics.inc("host_to_device")
            data = devices.to_device(value[0].t, flat.device)
            n = leaf(Leaf.DATA, data, aval, flat.device)
            n.source = "a 0-d CPU tensor used in device math"
            flat.inputs[i] = (n, 0)
    return (targs, tkw), flat


def leaves(args, kwargs):
    """Every argument of a call, lists and tuples flattened (in no particular order)."""
    stack = list(args) + list(kwargs.values())
    while stack:
        x = stack.pop()
        if isinstance(x, (list, tuple)):
            stack.extend(x)
        else:
            yield x


def _device_kwarg(kwargs) -> int:
    dev = kwargs.get("device")
    if isinstance(dev, torch.device) and devices.on_device(dev):
        return dev.index or 0
    return 0


# ---- meta inference, memoized by (op, template, input avals) ----

# Bounded like the fast path's table (``_fast``): about one entry per distinct call signature, plus the calls the fast
# path cannot key (host tensors, lists of tensors); each holds output avals only, a few hundred bytes.
_meta_cache = Memo("lazyxla.lazy.meta._meta_cache", limit=100_000)


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
    cargs = _restore_lists(_instantiate(targs, subst, make, device), list(args))
    ckw = {k: _restore_lists(_instantiate(v, subst, make, device), kwargs[k]) for k, v in tkw}
    return cargs, ckw


def _restore_lists(x, like):
    """Restore lists where the original args had lists (templates hold tuples)."""
    if isinstance(like, list):
        return [_restore_lists(e, lk) for e, lk in zip(x, like)]
    if isinstance(like, tuple) and type(x) is tuple:
        return tuple(_restore_lists(e, lk) for e, lk in zip(x, like))
    return x


def _spec(out, avals: list):
    if isinstance(out, torch.Tensor):
        avals.append(Aval(tuple(out.shape), out.dtype))
        return len(avals) - 1
    if isinstance(out, (list, tuple)):
        return (type(out), tuple(_spec(o, avals) for o in out))
    return ("const", out)


def _meta_key(func, ckey, flat: _Flat) -> tuple:
    # a Python number shares its aval with a 0-d tensor, but not PyTorch's promotion rules; an int input's value
    # class keys apart the values PyTorch's checks treat differently (``int_range``); the default dtype decides
    # factories' and true division's float dtype (``torch.set_default_dtype(torch.float64)``)
    return (func, ckey, tuple(_subst_key(s) for s in flat.meta_subst), torch.get_default_dtype())


def _subst_key(s):
    if isinstance(s, Aval):
        return s
    return (int, int_range(s)) if type(s) is int else float


def _infer(func, template, ckey, flat: _Flat, args, kwargs):
    key = _meta_key(func, ckey, flat)
    try:
        return _meta_cache.table[key]
    except KeyError:
        pass
    except TypeError:  # unhashable constant
        key = None
    margs, mkw = _call_args(template, flat.meta_subst, args, kwargs, _meta_tensor, _META)
    with torch_private.disable_functorch(), _no_python_dispatch():
        try:
            out = _OWN_META.get(func, func)(*margs, **mkw)
        except NotImplementedError as e:  # no meta kernel, or a data-dependent shape (a boolean mask)
            if func not in _MISSING_META:
                raise NoMeta(str(e)) from e
            out = _MISSING_META[func](*margs, **mkw)
        except Exception as e:  # the CPU kernel's exception type, if it raises another, is PyTorch's answer
            _check_on_cpu(func, template, flat, args, kwargs, (), meta_error=e)
            raise
    avals: list = []
    result = (_spec(out, avals), tuple(avals))
    for aval in result[1]:
        devices.np_dtype(aval.dtype)  # an unsupported dtype (complex32, ...) raises here, at the call
    _check_on_cpu(func, template, flat, args, kwargs, result[1])
    if key is not None:
        _meta_cache.remember(key, result)
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


# Functionalization writes a mutated ``as_strided`` view back to its base with ``as_strided_scatter``. For a view
# whose elements overlap (a stride 0: ``x.as_strided(..., (.., 0))``), which the CPU writes in place, PyTorch's CPU
# ``as_strided_scatter`` refuses that write-back ("more than one element of the written-to tensor refers to a single
# memory location"): no error of the user's, so the check lets it pass. A user's own ``as_strided_scatter`` gets the
# error from its AutogradPrivateUse1 kernel (frontend/kernels.py), which functionalization's write-back never runs.
_AS_STRIDED_SCATTER = torch.ops.aten.as_strided_scatter.default
_OVERLAP = "more than one element of the written-to tensor refers to a single memory location"


def _check_on_cpu(func, template, flat: _Flat, args, kwargs, out_avals, meta_error=None) -> None:
    """Raise, at the call, the error PyTorch's CPU kernel raises for this call (see ``lazy.check``)."""
    limit = _flags["check_max_elements"]
    in_avals = [s for s in flat.meta_subst if isinstance(s, Aval)]
    if limit <= 0 or check.numel(in_avals) + check.numel(out_avals) > limit or _masks_index(template, flat):
        return

    def lowers() -> bool:  # the call as a node, for asking whether its rule lowers it
        return to_jax.traces(node(func, tuple(flat.inputs), template, tuple(out_avals), flat.device, 0))

    try:
        check.raise_cpu_error(
            func,
            lambda make: _call_args(template, flat.meta_subst, args, kwargs, make, _CPU),
            random=RULES[func].random if func in RULES else True,
            meta_error=meta_error,
            lowers=lowers if func in RULES and out_avals else None,
        )
    except RuntimeError as e:
        if func is not _AS_STRIDED_SCATTER or _OVERLAP not in str(e):
            raise


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
# cache's): the check runs once per signature. Bounded like those tables (signatures that keep changing).
_checked = Memo("lazyxla.lazy.meta._checked", limit=100_000)


def check_before_decomposing(func, args, kwargs, scalars) -> None:
    """An op without a rule is about to be decomposed into ops that each have their own checks, but the
    op's own checks (a dim out of range for ``aminmax``, ...) would be lost: raise what the CPU raises."""
    if _flags["check_max_elements"] <= 0:
        return
    found = _signature(func, args, kwargs, *scalars)
    if found is not None and found[0] in _checked.table:
        return
    template, flat = _flatten(func, args, kwargs, place=False)
    key = _meta_key(func, canonical(template), flat)
    try:
        done = key in _checked.table
    except TypeError:  # an unhashable constant: checked, not remembered
        key, done = None, False
    if not done:
        margs, mkw = _call_args(template, flat.meta_subst, args, kwargs, _meta_tensor, _META)
        with torch_private.disable_functorch(), _no_python_dispatch():
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
            _checked.remember(key)
    if found is not None:
        _checked.remember(found[0])


def _spec_avals(out) -> list:
    avals: list = []
    _spec(out, avals)
    return avals


def _rnn_cell_check(input_gates, hidden_gates, state, input_bias, hidden_bias, gates: int) -> None:
    """The size checks of CUDA's fused cells (``checkSizes`` in ``RNN.cu``), biases optional as there."""
    width = input_gates.shape[1] if input_gates.ndim == 2 else -1
    if input_gates.shape != hidden_gates.shape or width % gates:
        raise RuntimeError(f"fused RNN cell: gates {tuple(input_gates.shape)} and {tuple(hidden_gates.shape)}")
    if state.ndim != 2 or tuple(state.shape) != (input_gates.shape[0], width // gates):
        raise RuntimeError(f"fused RNN cell: state {tuple(state.shape)} for gates {tuple(input_gates.shape)}")
    if (input_bias is None) != (hidden_bias is None) or any(
        b is not None and tuple(b.shape) != (width,) for b in (input_bias, hidden_bias)
    ):
        raise RuntimeError(f"fused RNN cell: both biases, of size {width}, or none")


def _fused_lstm_cell_meta(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """``hy``, ``cy`` and the ``[i, f, g, o]`` workspace (PyTorch's meta kernel fails without biases)."""
    _rnn_cell_check(input_gates, hidden_gates, cx, input_bias, hidden_bias, 4)
    return torch.empty_like(cx), torch.empty_like(cx), torch.empty_like(input_gates)


def _fused_gru_cell_meta(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """``hy`` and the ``[r, z, n, hx, hn]`` workspace CUDA's kernel saves for the backward."""
    _rnn_cell_check(input_gates, hidden_gates, hx, input_bias, hidden_bias, 3)
    return torch.empty_like(hx), input_gates.new_empty((hx.shape[0], 5 * hx.shape[1]))


def _fused_gru_cell_backward_meta(grad_hy, workspace, has_bias):
    """Gradients of the input gates, hidden gates, ``hx`` and the two biases (None without biases)."""
    batch, hidden = grad_hy.shape
    if tuple(workspace.shape) != (batch, 5 * hidden):
        raise RuntimeError(
            f"fused GRU cell backward: workspace {tuple(workspace.shape)} for gradient {(batch, hidden)}"
        )
    gates = workspace.new_empty((batch, 3 * hidden))
    bias = workspace.new_empty((3 * hidden,)) if has_bias else None
    return (
        gates,
        torch.empty_like(gates),
        torch.empty_like(grad_hy),
        bias,
        None if bias is None else torch.empty_like(bias),
    )


# Output metadata lazyxla computes itself: PyTorch's meta kernel is missing (the GRU cell, CUDA-only) or fails
# for valid calls (the LSTM cell without biases). Checked before PyTorch's own.
_OWN_META = {
    aten._thnn_fused_lstm_cell.default: _fused_lstm_cell_meta,
    aten._thnn_fused_gru_cell.default: _fused_gru_cell_meta,
    aten._thnn_fused_gru_cell_backward.default: _fused_gru_cell_backward_meta,
}


def _ctc_loss_meta(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """The loss per sequence and ``log_alpha``, whose last dim, 2 * max target length + 1 in PyTorch, depends on
    the lengths' values: bounded by the targets' shape instead (lowering/rules/ctc.py)."""
    width = targets.shape[1] if targets.dim() == 2 else targets.shape[0]
    frames, batch = log_probs.shape[:2]
    return log_probs.new_empty((batch,)), log_probs.new_empty((batch, frames, 2 * width + 1))


# Output metadata for ops that PyTorch gives no meta kernel (called with meta tensors).
_MISSING_META = {
    aten._ctc_loss.Tensor: _ctc_loss_meta,
    aten._ctc_loss_backward.default: lambda g, log_probs, *args, **kwargs: torch.empty_like(log_probs),
    aten._ctc_loss_backward.Tensor: lambda g, log_probs, *args, **kwargs: torch.empty_like(log_probs),
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
    return torch_private.disable_torch_dispatch()


def _build(spec, n, fresh=False):
    if type(spec) is int:
        return LazyTensor((n, spec), n.avals[spec], fresh=fresh)
    if spec[0] == "const":
        return spec[1]
    if spec[0] is list:  # a foreach group's outputs (lowering/rules/foreach.py): many, each a tensor
        avals = n.avals
        return [LazyTensor((n, s), avals[s], fresh=fresh) if type(s) is int else _build(s, n, fresh) for s in spec[1]]
    return spec[0](_build(s, n, fresh) for s in spec[1])


def _record_general(func, args, kwargs, fresh=False):
    """Record ``func``; returns the outputs and, for the fast path's cache, how it was recorded."""
    template, flat = _flatten(func, args, kwargs)
    ckey = canonical(template)
    spec, avals = _infer(func, template, ckey, flat, args, kwargs)
    base = op_hash(func, _with_default_dtype(ckey), flat.device)
    random = RULES[func].random
    out = _finish(func, tuple(flat.inputs), template, avals, spec, flat.device, base, random, fresh)
    return out, (template, base, spec, avals, random)


def _with_default_dtype(ckey):
    """``ckey``, and the default dtype when it is not float32: a Python float compared with an integer tensor is
    lowered in the default dtype (``to_jax._scalar_dtype``), so programs recorded under another default differ
    (float32 keeps the plain key, so the common case's hashes and disk-cache keys stay as they were)."""
    default = torch.get_default_dtype()
    return ckey if default is torch.float32 else (ckey, str(default))


def _finish(func, inputs, template, avals, spec, device, base, random, fresh=False):
    if random:
        inputs += ((rng.next_key_leaf(device), 0),)
    n = node(func, inputs, template, avals, device, base)
    if _flags["explain_recompiles"]:
        diagnostics.note_recorded(n)
    recorded = _counters["ops_recorded"] = _counters["ops_recorded"] + 1
    if recorded >= _session.next_growth_check:  # rarely true: a look at the pending graph's size (lazy/growth.py)
        growth.check(recorded)
    if type(spec) is int:
        return LazyTensor((n, spec), avals[spec], fresh=fresh)
    return _build(spec, n, fresh)


# ---- the fast path: calls whose arguments are lazyxla tensors and plain constants ----
#
# Such a call is keyed by its signature (op, device, each tensor's aval, each constant, a mark for each
# Python number that becomes a graph input, with an int's ``int_range``); the first call of a signature
# goes the general way above and leaves its template, hash and output avals here, so later calls skip
# flattening, canonical templates and meta inference.

_FLOAT_INPUT = ("float input",)
_INT_INPUT = "int input"
_CONSTANT_TYPES = frozenset({type(None), str, torch.dtype, torch.layout, torch.memory_format, torch.device})
# signature -> (template, hash, spec, avals, random): a model records a few thousand signatures; shapes that keep
# changing would grow it forever, so the oldest leave past 100,000 (each entry a few hundred bytes)
_fast = Memo("lazyxla.lazy.meta._fast", limit=100_000)


def _arg_signature(a, scalar: int, sig: list, inputs: list) -> int | None:
    """Append ``a``'s signature (and input, if any; ``scalar``: its ``scalar_args`` kind); returns its device
    (-1 for none), None if unusual."""
    t = type(a)
    if t is LazyTensor:
        inputs.append(a._value)
        sig.append(a._aval)
        return a._value[0].device
    if t is float:
        if scalar and (a not in _CONST_FLOATS or _spans[0]):
            inputs.append((_scalar_leaf(a, _F64), 0))
            sig.append(_FLOAT_INPUT)
        else:
            sig.append(canonical(a))  # (float, a, a == -1), telling 0.0 from -0.0
        return -1
    if t is int and _int_input(a, scalar):
        inputs.append((_scalar_leaf(a, _I64_AVAL), 0))
        sig.append((_INT_INPUT, int_range(a)))
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
            d = _arg_signature(a, pos_scalar[i] if i < len(pos_scalar) else BAKED, sig, inputs)
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
            d = _arg_signature(kwargs[k], kw_scalar.get(k, BAKED), sig, inputs)
            if d is None or (d != -1 and device != -1 and d != device):
                return None
            if d != -1:
                device = d
    if device == -1:
        return None  # no tensor argument: the general path finds the device
    sig.append(device)
    sig.append(torch.get_default_dtype())  # it decides promotions with Python floats (``_meta_key``)
    return tuple(sig), tuple(inputs), device


# id(op) -> its Scalar positions and Scalar keyword names (``scalar_args``): one int-keyed lookup per op
# instead of a cache lookup that hashes the OpOverload in Python. One entry per op used: PyTorch has ~4,000
# overloads (``torch._C._jit_get_all_schemas()``), custom ops add a few.
_scalars = Memo("lazyxla.lazy.meta._scalars", limit=20_000)


def _scalars_of(func) -> tuple:
    return _scalars.remember(id(func), scalar_args(func))


def record(func, args, kwargs, scalars=None, fresh=False):
    """Record ``func`` applied to ``args``/``kwargs`` as a new node; returns its LazyTensor output(s).

    ``scalars`` is ``scalar_args(func)`` where the caller has it at hand (dispatch's route). ``fresh``: the op reads
    no existing value (``torch.empty``): its outputs are made ``LazyTensor(..., fresh=True)``.
    """
    scalars = scalars or _scalars.table.get(id(func)) or _scalars_of(func)
    found = _signature(func, args, kwargs, *scalars)
    if found is not None:
        sig, inputs, device = found
        entry = _fast.table.get(sig)
        if entry is not None:
            template, base, spec, avals, random = entry
            return _finish(func, inputs, template, avals, spec, device, base, random, fresh)
    out, entry = _record_general(func, args, kwargs, fresh)
    if found is not None:
        _fast.remember(found[0], entry)
    return out
