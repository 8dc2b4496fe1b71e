"""Advanced indices as PyTorch's ``index`` and ``index_put_`` kernels take them (``x[i]``, ``x[mask] = v``).

PyTorch's advanced indexing (``make_info`` in TensorAdvancedIndexing.cpp) accepts index tensors on another device
than the tensor indexed: on CUDA, ``x[torch.tensor([0, 3])]``, ``x[cpu_mask]`` and ``x.index_put_((cpu_idx,), v)``
work, the indices moved to ``x``'s device. It also takes byte masks (deprecated, with a warning). PyTorch's meta
kernel, which records the op here, refuses both. So before an ``index``/``index_put`` is checked and recorded, its
``indices`` are rewritten as PyTorch's ``expandTensors`` does:

- a ``uint8`` mask is a bool mask (``!= 0``), with PyTorch's deprecation warning;
- a mask whose values the host has (a CPU mask, or a known value: ``lazy/known.py``) becomes the positions it
  selects, one integer index per mask dim, computed on the host (PyTorch's shape check first, its error raised):
  the result's shape is then known without a sync, as on CUDA, where a CPU mask's ``nonzero`` runs on the CPU;
- a CPU index tensor is copied to the device; a small integer one is a known value, so its bounds check is free.

A device mask the host does not know stays a mask (its rule, or the CPU fallback for a read, takes it).
``index_select``, ``gather`` and the other ops that take one index tensor refuse a CPU index, as CUDA's do.

Example::

    x = torch.arange(10.0, device=dev)
    x[torch.arange(10) > 5]          # the mask's positions computed on the host: no sync, no CPU fallback
"""

from __future__ import annotations

import warnings

import torch

from lazyxla.lazy.special import cpu_to_lazy
from lazyxla.lazy.tensor import LazyTensor
from lazyxla.observe import diagnostics

aten = torch.ops.aten

# The ops whose second argument is a list of advanced indices (None for a dim taken whole).
INDEX_OPS = frozenset(
    {
        aten.index.Tensor,
        aten._unsafe_index.Tensor,
        aten.index_put.default,
        aten._unsafe_index_put.default,
        aten._index_put_impl.default,
    }
)
_MASKS = (torch.bool, torch.uint8)
_UINT8_MASK = "indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead."


def preparer(func):
    """``prepare`` for an op that takes advanced indices, else None (``record.dispatch`` keeps it in the op's
    route, so other ops pay nothing)."""
    return prepare if func in INDEX_OPS else None


def prepare(func, args, kwargs, run) -> tuple[tuple, dict]:
    """``(args, kwargs)`` of an advanced-indexing op with its indices as this module's docstring says: each a
    lazyxla tensor of ``self``'s device, integer or a mask the host does not know (``run(func, args, kwargs)``
    dispatches the op that makes a device byte mask a bool one).

    Example::

        args, kwargs = prepare(aten.index.Tensor, (x, [cpu_mask]), {}, dispatch)   # [the mask's positions]
    """
    in_args = len(args) > 1
    indices = args[1] if in_args else kwargs["indices"]
    x = args[0] if args else kwargs["self"]
    if type(x) is not LazyTensor:  # a CPU tensor indexed by lazyxla tensors: PyTorch's error (as for CUDA indices)
        raise RuntimeError(f"indices should be either on cpu or on the same device as the indexed tensor ({x.device})")
    if all(i is None or (type(i) is LazyTensor and i.dtype not in _MASKS) for i in indices):
        return args, kwargs  # the common case: integer indices already on the device
    new = _expanded(x, indices, func, run)
    if in_args:
        return (args[0], new, *args[2:]), kwargs
    return args, {**kwargs, "indices": new}


def _expanded(x, indices, func, run) -> list:
    device = x._value[0].device
    out: list = []
    for i in indices:
        if i is None:
            out.append(None)
            continue
        if i.dtype is torch.uint8:
            warnings.warn(_UINT8_MASK, UserWarning, stacklevel=diagnostics.user_stacklevel() or 1)
        host = i if type(i) is not LazyTensor else i._value[0].host
        if i.dtype in _MASKS and i.dim() and host is not None:
            out.extend(_positions(x, host != 0 if host.dtype is torch.uint8 else host, len(out), indices, func))
        elif type(i) is not LazyTensor:  # a CPU (or 0-d) index: on the device, known when small
            out.append(cpu_to_lazy(i.to(torch.bool) if i.dtype is torch.uint8 else i, device))
        elif i.dtype is torch.uint8:  # a device byte mask the host does not know: a bool mask
            out.append(run(aten.ne.Scalar, (i, 0), {}))
        else:
            out.append(i)
    return out


def _positions(x, mask: torch.Tensor, at: int, indices, func) -> list:
    """The integer indices that select what ``mask`` selects of ``x``'s dims from ``at`` on (on the device,
    known when small); PyTorch's error for a mask that does not fit there."""
    if at + mask.dim() > x.dim() or tuple(mask.shape) != tuple(x.shape[at : at + mask.dim()]):
        _raise_as_cpu(x, indices, func)
    return [cpu_to_lazy(p.contiguous(), x._value[0].device) for p in mask.nonzero().unbind(1)]


def _raise_as_cpu(x, indices, func) -> None:
    """Raise the error PyTorch's CPU kernel raises for these indices' shapes (on stand-ins that hold no data): the
    mask's shape does not fit ``x``'s dims from its position on."""

    def stand_in(t):
        if t is None:
            return None
        host = t._value[0].host if type(t) is LazyTensor else t
        return host if host is not None else torch.zeros((), dtype=t.dtype).expand(t.shape)

    cpu_x = torch.zeros((), dtype=x.dtype).expand(x.shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the uint8 warning was given once, at the call
        aten.index.Tensor(cpu_x, [stand_in(t) for t in indices])
    raise IndexError(  # (PyTorch's kernel refused it above; this is for a torch that stops refusing it)
        f"{func}: a mask's shape does not match the shape of the indexed tensor {list(x.shape)} where it indexes it"
    )
