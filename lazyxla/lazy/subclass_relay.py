"""Ops that a tensor subclass's ``__torch_dispatch__`` runs on lazyxla tensors (DTensor over the lazyxla process
group): run again with functionalization restored.

Why: a wrapper subclass that holds lazyxla tensors inside (DTensor's local shards) calls ops on them with every
dispatch key above Python excluded, as PyTorch runs every ``__torch_dispatch__``: Functionalize too. A lazyxla user
tensor is a functionalization wrapper, so such an op skipped the wrapper's unwrapping and reached the PrivateUse1
key with wrappers: PyTorch's composite kernel of ``mm`` then made its output with ``empty`` (a bare LazyTensor) and
called ``mm.out`` on the wrappers, which lazyxla refused with a device mismatch naming ``lazyxla:0`` twice (a
wrapper and a bare tensor). An op that reaches PrivateUse1 with a wrapper while Functionalize is excluded is
therefore run again with Functionalize restored (``relayed``): the wrapper unwraps, lazyxla records the op, and
the result is a wrapper again.

When: *armed* (``arm()``) when a process group of the lazyxla backend is made (``init_process_group("lazyxla")``:
DTensor's multi-process execution model). Then lazyxla's own kernels and fallback check each op (``kernel``,
``fallback``: one flag read per op until armed), and the ops left to PyTorch's explicit composite kernels get a
PrivateUse1 kernel that checks too (``_install_composites``: ~2,200 registrations, ~20 ms, once). Not armed in
one process, and so not in SPMD mode, whose DTensors hold bare LazyTensors (``parallel/dtensor.py``): a PrivateUse1
kernel on those composite ops changes how FakeTensor, which DTensor's sharding propagation runs on, computes them.
``aten::detach`` is never relayed (``_NOT_RELAYED``): FakeTensor's constructor detaches outside any mode.

Example::

    arm()          # (done by the lazyxla process group)
    # inside DTensor's dispatch, mm of two wrappers is relayed: the result is a wrapper, recorded as outside it
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import torch

from lazyxla import torch_private

_armed = False  # arm(): ops check for a subclass's relay
_relaying = False  # inside a relayed op: a wrapper that reaches PrivateUse1 there is lazyxla's own business
_libraries: dict[str, torch.library.Library] = {}
_relayed_as: dict = {}  # op -> what a relay runs instead (relay_as)


def _holds_wrapper(args, kwargs) -> bool:
    for x in itertools.chain(args, kwargs.values()):
        if isinstance(x, torch.Tensor):
            if torch_private.is_functional(x):
                return True
        elif isinstance(x, (list, tuple)) and _holds_wrapper(x, {}):
            return True
    return False


def needs_relay(args, kwargs) -> bool:
    """Whether an op that reached the PrivateUse1 key with these arguments comes from a tensor subclass's
    ``__torch_dispatch__`` (Functionalize excluded, a functionalization wrapper among them): ``relayed`` runs it."""
    return _armed and not _relaying and torch_private.below_functionalization() and _holds_wrapper(args, kwargs)


def relayed(op, args, kwargs):
    """``op(*args, **kwargs)`` with Functionalize restored (see the module docstring).

    Example: inside DTensor's dispatch, ``relayed(aten.mm.default, (a_local, b_local), {})`` is the wrapper of
    ``a_local @ b_local``, as outside it."""
    global _relaying
    _relaying = True
    try:
        with torch_private.functionalization_restored():
            return _relayed_as.get(op, op)(*args, **kwargs)
    finally:
        _relaying = False


def relay_as(op, fn: Callable) -> None:
    """Have a relay of ``op`` run ``fn(*args, **kwargs)`` instead: for ops whose lazyxla kernel is above
    functionalization (at the Autograd key), which a relay, below autograd, does not reach.

    Example: ``relay_as(aten._fused_adamw_.default, functional_step_and_copies)`` (frontend/kernels.py: PyTorch's
    functionalization kernel of the in-place fused steps refuses an empty list argument)."""
    _relayed_as[op] = fn


def kernel(name: str, fn: Callable) -> Callable:
    """lazyxla's PrivateUse1 kernel ``fn`` of op ``name``, after the relay check (armed only)."""
    op = op_overload(name)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if _armed and needs_relay(args, kwargs):
            return relayed(op, args, kwargs)
        return fn(*args, **kwargs)

    return run


def fallback(fn: Callable) -> Callable:
    """lazyxla's PrivateUse1 fallback ``fn``, after the relay check (armed only)."""

    @functools.wraps(fn)
    def run(op, *args, **kwargs):
        if _armed and needs_relay(args, kwargs):
            return relayed(op, args, kwargs)
        return fn(op, *args, **kwargs)

    return run


def op_overload(name: str):
    """``torch.ops.<ns>.<op>.<overload>`` for ``"ns::op.overload"`` (or ``"ns::op"``: its default overload)."""
    namespace, _, rest = name.partition("::")
    op, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")


def arm() -> None:
    """Check every op for a subclass's relay from now on (done when a lazyxla process group is made)."""
    global _armed
    if not _armed:
        _install_composites()
        _armed = True


def _composite(name: str) -> Callable:
    """The PrivateUse1 kernel of a composite op: relayed from a subclass, else PyTorch's composite kernel."""
    composite = torch_private.computed_kernel(name, "PrivateUse1")
    op = None

    def run(keyset, *args, **kwargs):
        nonlocal op
        if needs_relay(args, kwargs):
            if op is None:
                op = op_overload(name)
            return relayed(op, args, kwargs)
        return composite.call_boxed(keyset, *args, **kwargs)

    return run


_EXPLICIT = ("CompositeExplicitAutogradNonFunctional", "CompositeExplicitAutograd")
# Composite ops that keep PyTorch's kernel. detach: ``Tensor._make_subclass`` (FakeTensor's constructor, which
# DTensor's sharding propagation runs) detaches a view that FakeTensor computed from a lazyxla-device fake, outside
# any mode; a Python kernel gives the detached tensor a Python object, and FakeTensor then refused to adopt it
# ("the raw Tensor object is already associated to a python object of type Tensor": every DTensor backward's
# expand). PyTorch's detach needs no relay: it is ``shallow_copy_and_detach``, which a functionalization wrapper
# answers with a wrapper.
_NOT_RELAYED = frozenset({"aten::detach"})


def _relayed_composites() -> list[str]:
    """The ops whose PrivateUse1 entry is PyTorch's explicit composite kernel. CompositeImplicitAutograd ops are
    left alone: a PrivateUse1 kernel would stop their decomposition above autograd, and a subclass receives them
    decomposed."""
    return [
        name
        for name in torch_private.all_op_names()
        if name not in _NOT_RELAYED
        and not torch_private.has_kernel(name, "PrivateUse1")
        and not torch_private.has_kernel(name, "CompositeImplicitAutograd")
        and any(torch_private.has_kernel(name, key) for key in _EXPLICIT)
    ]


def _install_composites() -> None:
    for name in _relayed_composites():
        namespace, _, op = name.partition("::")
        if namespace not in _libraries:
            _libraries[namespace] = torch.library.Library(namespace, "IMPL")
        _libraries[namespace].impl(op, _composite(name), "PrivateUse1", with_keyset=True)
