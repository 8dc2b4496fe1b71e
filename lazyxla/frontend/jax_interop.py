"""JAX inside PyTorch: ``lazyxla.call_jax``, ``@lazyxla.jax_function``, ``lazyxla.to_jax``, ``lazyxla.from_jax``.

Example::

    def rms_norm(x, w):                              # any JAX function of jax.Arrays (jax.numpy, a Pallas kernel)
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * w

    y = lazyxla.call_jax(rms_norm, x, w)             # lazyxla tensors in and out; one node of the step's program
    y.sum().backward()                               # gradients through jax.vjp (or the function's custom_vjp)

Design
------
A call flattens ``(args, kwargs)`` with ``jax.tree_util``: tensors are the call's inputs, every other leaf a static
argument (hashable: it keys the compiled program, as ``jax.jit``'s ``static_argnums`` do). Once per signature
(function, static arguments, the tensors' avals) the function is traced with ``jax.make_jaxpr`` (under the 64-bit
mode and matmul precision the step's program is lowered with): that gives the outputs' avals and, from the
jaxpr's text, the name the call is recorded under (``lowering/rules/jax_call.py``), so the compile cache hits
across steps even for a lambda made anew each call. Each call records ONE node, ``lazyxla::call_jax(inputs,
name)``, as ``torch.compile`` graphs (``compiled_graph``) and loops (``scan``) are recorded: nothing runs until
the step's sync, where the rule calls the function inside the step's ``jax.jit``.

Autograd: when an input needs a gradient, the call is a ``torch.autograd.Function`` whose backward is another
``call_jax`` call, of ``jax.vjp`` of the function (so a ``jax.custom_vjp`` uses its own rule), over the primal
inputs and the outputs' cotangents. Only floating-point inputs get gradients; integer and boolean outputs are not
differentiable. The backward recomputes the function's forward inside the program (XLA may share it with the
forward when both are in one program); being a ``call_jax`` call itself, it is differentiable again.

``to_jax``/``from_jax`` exchange device buffers without a copy: a tensor's value is a ``jax.Array`` already (a
device-data leaf, ``ir.Leaf.DATA``). Buffers the user holds both ways are never donated to a program
(``graph.SHARED``), since donation deletes the ``jax.Array``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import torch

from lazyxla.config import config
from lazyxla.device import devices
from lazyxla.ir import IN, Aval, Leaf, canonical, leaf, node, op_hash, raise_if_error
from lazyxla.lazy import eager, graph
from lazyxla.lazy.tensor import LazyTensor, unwrap, wrap
from lazyxla.lowering.rules import jax_call
from lazyxla.lowering.rules.jax_call import OP
from lazyxla.observe import diagnostics, metrics
from lazyxla.util import Memo

# signature (function, tree, static leaves, avals, lowering flags) -> _Plan; a lambda made anew per call adds one
# entry per call, so the table is bounded
_PLANS = Memo("lazyxla.frontend.jax_interop._plans", limit=4096)
_VJPS = Memo("lazyxla.frontend.jax_interop._vjps", limit=4096)  # (plan, wanted inputs, cotangents) -> backward _Plan


@dataclasses.dataclass(frozen=True)
class _Plan:
    """One traced signature of a function: what a call records."""

    name: str  # the node's function name (jax_call.name_of)
    flat: Callable  # input arrays -> list of output arrays (registered under ``name`` for the rule)
    in_avals: tuple[Aval, ...]
    avals: tuple[Aval, ...]  # the outputs'
    out_tree: Any  # the outputs' pytree structure


def call_jax(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Call the JAX function ``fn`` on lazyxla tensors, as one node of the step's program: lazyxla tensors out.

    ``args`` and ``kwargs`` are any pytree (``jax.tree_util``) of lazyxla tensors and Python values; ``fn``
    receives each tensor as a ``jax.Array`` and every other leaf as it is (a static argument: it must be hashable,
    and each value gives its own compiled program). ``fn`` returns a pytree of ``jax.Array``s; the call returns the
    same pytree of lazyxla tensors, pending until the next sync, like any op's results. The tensors must be on one
    lazyxla device. ``fn`` may be ``jax.numpy`` code, a Pallas kernel (``pl.pallas_call``), a ``shard_map`` or a
    ``jax.custom_vjp`` function. It runs under lazyxla's 64-bit mode: ``jnp.zeros(3)`` inside it is float64 (give
    dtypes, or derive them from the inputs). On the CPU a Pallas kernel must be interpreted (``interpret=True``):
    one that is not raises ``ValueError`` at the call, before anything is compiled.

    Autograd works through it: gradients of floating-point inputs come from ``jax.vjp`` of ``fn`` (a
    ``custom_vjp``'s own rule), recorded lazily as another ``call_jax`` node.

    Example::

        import jax.numpy as jnp

        def gelu_tanh(x, *, approximate):            # approximate: a static (hashable) argument
            return jax.nn.gelu(x, approximate=approximate)

        y = lazyxla.call_jax(gelu_tanh, x, approximate=True)      # x: a lazyxla tensor; y: one too
        out = lazyxla.call_jax(lambda d: {"sum": d["a"] + d["b"]}, {"a": x, "b": x})   # pytrees in and out
    """
    if not callable(fn):
        raise TypeError(f"lazyxla.call_jax: fn must be a JAX function (callable), got {type(fn).__name__}")
    label = _label(fn)
    flat_with_paths, treedef = jax.tree_util.tree_flatten_with_path((args, kwargs), is_leaf=_is_tensor)
    tensors, positions, statics = [], [], []
    for k, (path, x) in enumerate(flat_with_paths):
        if isinstance(x, torch.Tensor):
            tensors.append(x)
            positions.append(k)
            statics.append(None)
        else:
            statics.append(_static(x, path, label))
    device = _device_of(tensors, [flat_with_paths[k][0] for k in positions], label)
    in_avals = tuple(Aval(tuple(t.shape), t.dtype) for t in tensors)
    plan = _plan(fn, label, treedef, tuple(statics), tuple(positions), in_avals)
    outs = _apply(plan, tensors, device)
    return jax.tree_util.tree_unflatten(plan.out_tree, outs)


def jax_function(fn: Callable) -> Callable:
    """Decorator: ``fn``, a JAX function, called on lazyxla tensors through :func:`call_jax`.

    Example::

        @lazyxla.jax_function
        def swiglu(x, w1, w2):
            return jax.nn.silu(x @ w1) * (x @ w2)

        y = swiglu(x, w1, w2)                        # lazyxla tensors in, a lazyxla tensor out, differentiable
    """
    if not callable(fn):
        raise TypeError(f"lazyxla.jax_function decorates a JAX function, got {type(fn).__name__}")

    @functools.wraps(fn)
    def called(*args, **kwargs):
        return call_jax(fn, *args, **kwargs)

    called.jax_fn = fn  # the JAX function itself, to call from JAX code
    return called


def to_jax(t: torch.Tensor) -> jax.Array:
    """The ``jax.Array`` holding lazyxla tensor ``t``'s value, without a copy.

    A pending ``t`` is computed first, with only the work it needs (as a host read computes, but nothing is copied
    to the host). The array is the tensor's device buffer (in SPMD mode the global, sharded array): lazyxla never
    donates it to a later program, so it stays valid when ``t`` is changed in place; ``t`` and the array stay
    equal until then. It exports DLPack (``torch.from_dlpack`` on the CPU backend, ``jax.dlpack``).

    Example::

        a = lazyxla.to_jax(model.fc.weight)           # jax.Array, shape (out, in)
        b = jnp.linalg.svd(a, compute_uv=False)       # plain JAX from here on
    """
    if not isinstance(t, torch.Tensor) or not devices.on_device(t):
        where = f"a tensor on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(
            f"lazyxla.to_jax takes a lazyxla tensor, got {where}; move it with .to({devices.torch_device(0)}) first "
            "(or use jnp.asarray(t.numpy()) for a CPU tensor)"
        )
    lt = unwrap(t)
    if lt._value[0].op is not Leaf.DATA:
        graph.sync_tensors([lt], reason="lazyxla.to_jax")
    n = lt._value[0]
    raise_if_error(n)
    graph.SHARED.add(n)
    return n.payload


def from_jax(a: jax.Array, device: torch.device | str | int | None = None) -> torch.Tensor:
    """A lazyxla tensor holding ``a``, a ``jax.Array``, without a copy when ``a`` is on that device already.

    ``device``: the lazyxla device (default ``lazyxla:0``); an array on another jax device is copied there (in SPMD
    mode, one not laid out over the run's devices is replicated over them). The tensor's dtype is ``a``'s (bfloat16
    included). The buffer is shared: lazyxla never donates it to a program, so ``a`` stays valid when the tensor is
    changed in place (which gives the tensor a new buffer; ``a`` is immutable, as every ``jax.Array``). For another
    DLPack producer, ``from_jax(jax.dlpack.from_dlpack(x))``.

    Example::

        t = lazyxla.from_jax(jnp.arange(6.0).reshape(2, 3))     # on lazyxla:0, float32, no copy on that device
        (t * 2).sum().item()                                      # 30.0
    """
    if not isinstance(a, jax.Array) or isinstance(a, jax.core.Tracer):
        what = "a jax tracer (inside a jax transformation)" if isinstance(a, jax.Array) else type(a).__name__
        hint = ".to(lazyxla.device())" if isinstance(a, torch.Tensor) else "jax.numpy.asarray(...) first"
        raise TypeError(f"lazyxla.from_jax takes a concrete jax.Array, got {what}; for this value use {hint}")
    try:
        dtype = devices.torch_dtype(a.dtype)
    except KeyError:
        raise TypeError(f"lazyxla.from_jax: dtype {a.dtype} has no PyTorch counterpart lazyxla supports") from None
    index = _index(device)
    a = _placed(a, index)
    aval = Aval(tuple(a.shape), dtype)
    n = leaf(Leaf.DATA, a, aval, index)
    n.source = f"lazyxla.from_jax at {diagnostics.user_frame(2)}"
    graph.SHARED.add(n)
    return wrap(LazyTensor((n, 0), aval, fresh=True))


def traced_signatures() -> int:
    """How many call signatures (function, static arguments, pytree structure, avals) ``call_jax`` has traced and
    keeps: torch_xla's ``xla_builder._jax_to_xla_computation_cache_elements()`` answers it.

    Example::

        n = traced_signatures(); call_jax(jnp.sin, x); call_jax(jnp.sin, x)
        assert traced_signatures() == n + 1           # the second call found the first one's plan
    """
    return len(_PLANS.table)


# ---- a call ------------------------------------------------------------------------------------------------------


def _is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def _label(fn) -> str:
    inner = getattr(fn, "func", fn)  # functools.partial
    return getattr(inner, "__name__", type(inner).__name__).replace("<", "").replace(">", "")


def _static(x, path, label: str):
    where = f"argument {jax.tree_util.keystr(path)}"
    if isinstance(x, jax.Array):
        raise TypeError(
            f"lazyxla.call_jax({label}): {where} is a jax.Array; pass device values as lazyxla tensors "
            "(lazyxla.from_jax(a)), or close over the array in fn (a constant of the program)"
        )
    try:
        hash(x)
    except TypeError:
        raise TypeError(
            f"lazyxla.call_jax({label}): {where} ({type(x).__name__}) is not a tensor, so it is a static argument "
            "of fn, and static arguments must be hashable (each value keys its own compiled program): pass arrays "
            "as lazyxla tensors, or make it hashable (a tuple instead of a list, a frozen dataclass)"
        ) from None
    return x


def _device_of(tensors: list, paths: list, label: str) -> int:
    if not tensors:
        raise ValueError(
            f"lazyxla.call_jax({label}): no tensor among the arguments; pass at least one lazyxla tensor (the call "
            "runs on its device)"
        )
    found = None
    for t, path in zip(tensors, paths):
        if not devices.on_device(t):
            raise ValueError(
                f"lazyxla.call_jax({label}): argument {jax.tree_util.keystr(path)} is a tensor on {t.device}; "
                f"call_jax runs fn inside a lazyxla device's program: move it there first "
                f"(.to({devices.torch_device(0)}), or lazyxla.device())"
            )
        if found is None:
            found = t.device
        elif t.device != found:
            raise ValueError(
                f"lazyxla.call_jax({label}): the tensors are on {found} and {t.device}; put them on one lazyxla device"
            )
    return found.index or 0


def _plan(fn, label: str, treedef, statics: tuple, positions: tuple, in_avals: tuple) -> _Plan:
    key = (fn, treedef, canonical(statics), positions, in_avals, config.matmul_precision, devices.spmd_enabled())
    try:
        plan = _PLANS.table.get(key)
    except TypeError:  # fn itself is unhashable, or a static argument's hash or equality fails on a value inside it
        raise TypeError(
            f"lazyxla.call_jax({label}): fn or a static argument is not hashable (they key the compiled program): "
            "pass a function (or functools.partial) and hashable static values"
        ) from None
    if plan is None:
        flat, out_tree = _flat(fn, label, treedef, statics, positions)
        plan = _PLANS.remember(key, _traced(label, flat, in_avals, out_tree))
    return plan


def _flat(fn, label: str, treedef, statics: tuple, positions: tuple):
    """``fn`` as a function of its tensor inputs' arrays alone, returning the flat list of its outputs; and a cell
    that receives the outputs' pytree structure when it is traced."""
    out_tree: list = [None]

    def flat(*arrays):
        leaves = list(statics)
        for k, a in zip(positions, arrays):
            leaves[k] = a
        args, kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
        out = fn(*args, **kwargs)
        outs, out_tree[0] = jax.tree_util.tree_flatten_with_path(out)
        for path, o in outs:
            if not isinstance(o, jax.Array):
                where = jax.tree_util.keystr(path) or "its"
                raise TypeError(
                    f"lazyxla.call_jax({label}): fn returned {type(o).__name__} at {where} output; fn must return "
                    "jax.Arrays (a pytree of them): wrap numbers in jnp.asarray"
                )
        return [o for _, o in outs]

    return flat, out_tree


def _traced(label: str, flat: Callable, in_avals: tuple, out_tree_cell: list) -> _Plan:
    """Trace ``flat`` on ``in_avals``: its jaxpr names it, its output shapes are the node's avals."""
    structs = [jax.ShapeDtypeStruct(a.shape, devices.np_dtype(a.dtype)) for a in in_avals]
    with devices.x64(), jax.default_matmul_precision(config.matmul_precision):
        closed, shapes = jax.make_jaxpr(flat, return_shape=True)(*structs)
    if devices.platform() == "cpu" and _compiled_pallas(closed.jaxpr):
        raise PallasNotInterpretedError(
            f"lazyxla.call_jax({label}): fn calls pl.pallas_call without interpret=True, and Pallas compiles no "
            "kernel for the CPU (jax's 'Only interpret mode is supported on CPU backend'). Pass interpret=True to "
            "pl.pallas_call (its kernel then runs as XLA ops), or call fn through torch_xla's "
            "make_kernel_from_pallas (lazyxla.compat), which runs kernels written for TPUs in Pallas's TPU "
            "interpreter off a TPU and compiles them on one"
        )
    if not shapes:
        raise TypeError(f"lazyxla.call_jax({label}): fn returned no arrays; it must return at least one jax.Array")
    avals = []
    for s in shapes:
        try:
            avals.append(Aval(tuple(s.shape), devices.torch_dtype(s.dtype)))
        except KeyError:
            raise TypeError(
                f"lazyxla.call_jax({label}): fn returned dtype {s.dtype}, which PyTorch has no "
                "counterpart for in lazyxla; cast it inside fn"
            ) from None
    name = jax_call.name_of(label, closed, flat)
    jax_call.register(name, flat)
    return _Plan(name, flat, in_avals, tuple(avals), out_tree_cell[0])


class PallasNotInterpretedError(ValueError):
    """A ``pl.pallas_call`` that is not interpreted, traced for the CPU: Pallas compiles kernels for GPUs and TPUs."""


def _compiled_pallas(jaxpr) -> bool:
    """Whether ``jaxpr`` (or one nested in it: ``jit``, ``custom_vjp``, control flow) has a ``pallas_call`` to be
    compiled (``interpret`` off), which jax refuses to lower for the CPU only when the step's program is lowered:
    checked at the call instead, so the error names the call."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            if not eqn.params.get("interpret"):
                return True
        elif any(_compiled_pallas(sub) for sub in jax.extend.core.jaxprs_in_params(eqn.params)):
            return True
    return False


def _apply(plan: _Plan, tensors: list, device: int) -> list:
    if torch.is_grad_enabled() and any(t.requires_grad and t.dtype.is_floating_point for t in tensors):
        return list(_CallJax.apply(plan, device, *tensors))
    return _record(plan, tensors, device)


def _record(plan: _Plan, tensors: list, device: int) -> list:
    inputs = tuple(unwrap(t)._value for t in tensors)
    template = ((tuple(IN[: len(inputs)]), plan.name), ())
    n = node(OP, inputs, template, plan.avals, device, op_hash(OP, canonical(template), device))
    if config.explain_recompiles:
        diagnostics.note_recorded(n)
    metrics.inc("jax_calls")
    results = eager.computed([LazyTensor((n, k), a) for k, a in enumerate(plan.avals)])  # now, in eager mode
    return [wrap(t) for t in results]


class _CallJax(torch.autograd.Function):
    """A call under autograd: forward records the call, backward a call of its ``jax.vjp``."""

    @staticmethod
    def forward(ctx, plan: _Plan, device: int, *tensors):
        ctx.plan, ctx.device = plan, device
        ctx.save_for_backward(*tensors)
        outs = _record(plan, list(tensors), device)
        ctx.mark_non_differentiable(*[o for o, a in zip(outs, plan.avals) if not a.dtype.is_floating_point])
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        tensors = ctx.saved_tensors
        plan = ctx.plan
        wanted = tuple(bool(need) and t.dtype.is_floating_point for need, t in zip(ctx.needs_input_grad[2:], tensors))
        if not any(wanted):
            return (None, None, *[None] * len(tensors))
        cts = [
            g if g is not None else torch.zeros(a.shape, dtype=a.dtype, device=tensors[0].device)
            for g, a in zip(grads, plan.avals)
            if a.dtype.is_floating_point
        ]
        back = _vjp_plan(plan, wanted, tuple(Aval(tuple(g.shape), g.dtype) for g in cts))
        got = iter(_apply(back, [*tensors, *cts], ctx.device))
        return (None, None, *[next(got) if w else None for w in wanted])


def _vjp_plan(plan: _Plan, wanted: tuple, ct_avals: tuple) -> _Plan:
    """The backward of ``plan``: (its inputs, the floating outputs' cotangents) -> the gradients of ``wanted``."""
    key = (plan, wanted, ct_avals)  # the plan, not its name: custom_vjp rules print by name alone (jax_call.name_of)
    back = _VJPS.table.get(key)
    if back is None:
        label = plan.name.rsplit("-", 1)[0]
        try:
            traced = _traced(f"{label}.vjp", _vjp_flat(plan, wanted), plan.in_avals + ct_avals, [None])
        except PallasNotInterpretedError:  # its backward's kernels: the message says what to do already
            raise
        except Exception as e:  # jax's own error, with what to do about the common case
            raise TypeError(
                f"lazyxla.call_jax({label}): jax cannot differentiate fn ({type(e).__name__}: {e}). A Pallas kernel "
                "(pl.pallas_call) has no reverse-mode rule of its own: give it one with jax.custom_vjp, or call it "
                "on tensors that do not require grad"
            ) from e
        back = _VJPS.remember(key, traced)
    return back


def _vjp_flat(plan: _Plan, wanted: tuple) -> Callable:
    k = len(plan.in_avals)
    diff = [i for i, w in enumerate(wanted) if w]
    floats = [a.dtype.is_floating_point for a in plan.avals]

    def vjp(*arrays):
        primals, cts = list(arrays[:k]), iter(arrays[k:])

        def of_wanted(*xs):
            full = list(primals)
            for i, x in zip(diff, xs):
                full[i] = x
            return plan.flat(*full)

        outs, pullback = jax.vjp(of_wanted, *[primals[i] for i in diff])
        full_cts = [next(cts) if f else _zero_cotangent(o) for o, f in zip(outs, floats)]
        return list(pullback(full_cts))

    return vjp


def _zero_cotangent(o):
    """A cotangent for an output that gets none (integer, boolean: ``float0``; complex: zeros)."""
    if jnp.issubdtype(o.dtype, jnp.inexact):
        return jnp.zeros(o.shape, o.dtype)
    return np.zeros(o.shape, jax.dtypes.float0)


# ---- from_jax ----------------------------------------------------------------------------------------------------


def _index(device) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if not devices.on_device(d):
        raise ValueError(f"lazyxla.from_jax: device must be a lazyxla device, got {d}")
    return d.index or 0


def _placed(a: jax.Array, index: int) -> jax.Array:
    """``a`` where lazyxla device ``index`` keeps its tensors: as it is when it is there already."""
    if devices.spmd_enabled():
        if set(a.sharding.device_set) == set(devices.global_devices()):
            return a
        return devices.relayout(a, devices.replicated())
    target = devices.jax_device(index)
    if a.sharding.device_set == {target}:
        return a
    metrics.inc("host_to_device")
    with devices.x64():
        return jax.device_put(a, target)
