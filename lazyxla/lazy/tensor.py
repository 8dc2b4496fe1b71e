"""``LazyTensor``: a ``torch.Tensor`` wrapper subclass holding one IR value.

Users never see it directly: every lazyxla tensor they hold is a functionalization wrapper around a
``LazyTensor``, so views and in-place ops reach us as functional ops.
"""

from __future__ import annotations

import itertools
import weakref

import torch

from lazyxla.lazy.ir import Aval, Leaf, Node

# Every live LazyTensor, in creation order: sync() finds pending work here, and donation asks it
# which device buffers are still held by a tensor.
_live: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_ids = itertools.count()


class LazyTensor(torch.Tensor):
    _value: tuple  # (Node, output index)

    @staticmethod
    def __new__(cls, value: tuple, aval: Aval, requires_grad: bool = False):
        node: Node = value[0]
        t = torch.Tensor._make_wrapper_subclass(
            cls, aval.shape, dtype=aval.dtype, device=torch.device("lazyxla", node.device), requires_grad=requires_grad
        )
        t._value = value
        _live[next(_ids)] = t
        return t

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from lazyxla.lazy.record import dispatch

        return dispatch(func, args, kwargs or {})

    @property
    def pending(self) -> bool:
        return self._value[0].op is not Leaf.DATA

    def __repr__(self) -> str:  # only seen when debugging lazyxla itself
        return f"LazyTensor({self._value[0]!r}[{self._value[1]}])"


def live_tensors() -> list[LazyTensor]:
    return list(_live.values())


def wrap(lt: LazyTensor) -> torch.Tensor:
    """The user-visible tensor: a functionalization wrapper around ``lt``."""
    return torch._to_functional_tensor(lt)


def unwrap(t: torch.Tensor) -> LazyTensor:
    """The LazyTensor inside a user-visible lazyxla tensor, after applying pending view updates."""
    if isinstance(t, LazyTensor):
        return t
    if torch._is_functional_tensor(t):
        torch._sync(t)
        inner = torch._from_functional_tensor(t)
        if isinstance(inner, LazyTensor):
            return inner
    raise TypeError(f"expected a lazyxla tensor, got a tensor on {t.device} of type {type(t).__name__}")
