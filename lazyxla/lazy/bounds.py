"""Index bounds checks: PyTorch's ``IndexError`` for an out-of-range index, at the call.

An XLA gather reads out of range as a fill value (NaN for floats, the lowest integer for signed ints) and an
XLA scatter drops out-of-range writes: an ``Embedding`` fed id 11 of 10, a ``cross_entropy`` target 12 of 10
classes, a ``gather`` or ``scatter_add`` past a dim, run on without a word. PyTorch's CPU and CUDA kernels raise.
The check needs the index values, which live on the device; so:

- an index whose values the host already has (a small integer tensor copied from the CPU or computed from
  such values: ``lazy/known.py``) is always checked, on that copy: it costs no sync;
- any other index is checked when ``config.check_indices`` is on (``LAZYXLA_CHECK_INDICES=1``), and always in
  eager mode (``config.eager``): the index's minimum and maximum (one small device reduction, its targets
  masked out for ``nll_loss``'s ``ignore_index``) are read on the host at the call, and compared with the
  size. Each such read is a sync (counted as ``index_checks``, timed as ``index_check``); in lazy mode it also
  computes the work the index depends on. Inside a ``lazyxla.compile`` region (one program, by promise) only
  host-known indices are checked.

The exception is PyTorch's CPU one, type and message (``IndexError: index out of range in self`` for
``embedding``/``index_select``, ``RuntimeError: index 3 is out of bounds for dimension 1 with size 3`` for
``gather``/``scatter*``/``index_add``, ``IndexError: Target 12 is out of bounds.`` for ``nll_loss``); a
device check names the smallest index below the range, else the largest above it (PyTorch's CPU names the
first out-of-range one it meets: the same when one index is out of range).

Only the outermost checked op of a call is checked: ``take``'s decomposition into ``index`` is not checked
again.

Example::

    lazyxla.config.check_indices = True
    F.embedding(ids, weight)      # IndexError: index out of range in self, at this line, if an id >= 10
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from lazyxla.config import config
from lazyxla.lazy import determinism
from lazyxla.lazy.meta import record
from lazyxla.lazy.special import lazy_to_cpu
from lazyxla.lazy.tensor import LazyTensor
from lazyxla.observe import diagnostics, metrics

aten = torch.ops.aten
_values = config._values  # read per checked op: a dict lookup, not lazyxla.config's attribute hook
_INTEGER = frozenset({torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32})
_local = threading.local()  # per thread: inside a checked op (its decomposition is not checked again)


class _Bound:
    """One index tensor an op reads: valid values lo <= v < hi (except ``ignore``), and the error for a value
    outside."""

    __slots__ = ("index", "lo", "hi", "ignore", "error", "count")

    def __init__(
        self, index, lo: int, hi: int, error: Callable[[int], Exception], ignore: int | None = None, count: int = 0
    ):
        self.index, self.lo, self.hi, self.error, self.ignore = index, lo, hi, error, ignore
        # count > 0: the value checked is not each element but the number of True ones, times ``count`` (a mask
        # broadcast to ``count`` times its size)
        self.count = count


def _size(x, dim: int) -> tuple[int, int]:
    """(dim wrapped, its size) of ``x``; a 0-d tensor counts as one of size 1, as PyTorch's kernels take it."""
    shape = tuple(x.shape) or (1,)
    d = dim % len(shape)
    return d, shape[d]


def _bind(func, args, kwargs) -> dict:
    """The op's arguments by name (defaults filled in)."""
    out = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out[a.name] = args[i]
        else:
            out[a.name] = kwargs.get(a.name, a.default_value)
    return out


def _out_of_bounds(kind: type, prefix: str = "") -> Callable:
    """``index 11 is out of bounds for dimension 0 with size 10``, as PyTorch's kernels say it."""

    def make(d: int, n: int) -> Callable[[int], Exception]:
        return lambda v: kind(f"{prefix}index {v} is out of bounds for dimension {d} with size {n}")

    return make


def _out_of_range_in_self(v: int) -> Exception:
    return IndexError("index out of range in self")


def _along_dim(self_name: str, error, negative: bool = False):
    """Ops whose ``index`` indexes ``self`` along ``dim`` (gather, scatter, index_select, index_add, ...)."""

    def bounds(a: dict) -> list[_Bound]:
        d, n = _size(a[self_name], a["dim"])
        return [_Bound(a["index"], -n if negative else 0, n, error(d, n))]

    return bounds


def _plain(error):
    return lambda d, n: error


def _index(a: dict) -> list[_Bound]:
    """``x[i, j]`` (``index``, ``index_put``): each integer index tensor in [-size, size) of its dim; PyTorch's
    message counts dims among the indexed ones (they are moved to the front)."""
    out, dim, k = [], 0, 0
    shape = tuple(a["self"].shape)
    for t in a["indices"]:
        if t is None:
            dim += 1
            continue
        if t.dtype in (torch.bool, torch.uint8):  # a mask: its shape is checked by the meta kernel
            dim += t.dim()
            k += t.dim()
            continue
        if dim < len(shape):
            n = shape[dim]
            out.append(_Bound(t, -n, n, _out_of_bounds(IndexError)(k, n) if n else _empty_dim))
        dim += 1
        k += 1
    return out


def _empty_dim(v: int) -> Exception:
    return IndexError("index is out of bounds for dimension with size 0")  # PyTorch's words for any index there


def _take(a: dict) -> list[_Bound]:
    n = a["self"].numel()

    def error(v: int) -> Exception:
        return IndexError(f"out of range: tried to access index {v} on a tensor of {n} elements.")

    return [_Bound(a["index"], -n, n, error)]


def _target(error_dim: int):
    """``nll_loss``'s targets: in [0, classes), except ``ignore_index``."""

    def bounds(a: dict) -> list[_Bound]:
        x = a["self"]
        classes = x.shape[error_dim] if x.dim() > 1 else (x.shape[0] if x.dim() == 1 else 1)

        def error(v: int) -> Exception:
            return IndexError(f"Target {v} is out of bounds.")

        return [_Bound(a["target"], 0, classes, error, ignore=a["ignore_index"])]

    return bounds


def _masked_scatter(a: dict) -> list[_Bound]:
    """``masked_scatter``: the mask's True count (the mask broadcast to the result) at most source's size."""
    mask, n = a["mask"], a["source"].numel()
    shape = torch.broadcast_shapes(a["self"].shape, mask.shape)
    if mask.dtype != torch.bool or not mask.numel() or not shape.numel():
        return []

    def error(v: int) -> Exception:
        return RuntimeError("Number of elements of source < number of ones in mask")

    return [_Bound(mask, 0, n + 1, error, count=shape.numel() // mask.numel())]


_SCATTER = _along_dim("self", _out_of_bounds(RuntimeError))
# op -> its arguments by name -> the index tensors it reads and their bounds
CHECKS: dict = {
    aten.index.Tensor: _index,
    aten.index_put.default: _index,
    aten._index_put_impl.default: _index,
    aten.index_select.default: _along_dim("self", _plain(_out_of_range_in_self)),
    aten.embedding.default: lambda a: [_Bound(a["indices"], 0, _size(a["weight"], 0)[1], _out_of_range_in_self)],
    aten.gather.default: _SCATTER,
    aten.scatter.src: _SCATTER,
    aten.scatter.value: _SCATTER,
    aten.scatter.reduce: _SCATTER,
    aten.scatter.value_reduce: _SCATTER,
    aten.scatter_add.default: _SCATTER,
    aten.scatter_reduce.two: _SCATTER,
    aten.index_add.default: _SCATTER,
    aten.index_reduce.default: _along_dim("self", _plain(_out_of_range_in_self)),
    aten.index_copy.default: _along_dim("self", _out_of_bounds(IndexError, "index_copy_(): ")),
    aten.index_fill.int_Scalar: _along_dim("self", _out_of_bounds(IndexError), negative=True),
    aten.index_fill.int_Tensor: _along_dim("self", _out_of_bounds(IndexError), negative=True),
    aten.take.default: _take,
    aten.put.default: _take,  # the same bounds and message as take's
    aten.masked_scatter.default: _masked_scatter,
    aten.nll_loss_forward.default: _target(1),
    aten.nll_loss2d_forward.default: _target(1),
}


def checker(func) -> Callable | None:
    """The bounds check of ``func`` (``check(func, args, kwargs)`` applies it), or None for an op that reads
    no index: ``record.dispatch`` keeps it in the op's route, so other ops pay nothing."""
    return check if func in CHECKS or func in determinism.ALERTS else None


def check(func, args, kwargs, run: Callable):
    """``run(func, args, kwargs)`` after checking the op's indices (this module's docstring says which, and
    when): PyTorch's error, raised at the call, for one out of range. The ops ``run`` dispatches inside are not
    checked again (``inside``).

    Example::

        return check(func, args, kwargs, dispatch)      # in record.dispatch, for an op in CHECKS
    """
    named = _bind(func, args, kwargs)
    determinism.alert(func, named)  # PyTorch alerts before its kernel runs
    _local.inside = True
    try:  # recorded first: PyTorch's own errors (shapes, dims, dtypes) come before an index's, as on the CPU
        out = run(func, args, kwargs)
    finally:
        _local.inside = False
    on_device = []
    for b in CHECKS.get(func, _no_bounds)(named):
        dtypes = (torch.bool,) if b.count else _INTEGER
        usable = type(b.index) is LazyTensor and b.index.dtype in dtypes and b.index.numel()
        if usable and not _checked_on_host(b):
            on_device.append(b)
    if on_device and (_values["check_indices"] or config.eager) and not diagnostics.active_regions():
        _check_on_device(on_device)
    return out  # an op whose index is out of range raised above: its recorded result is never handed out


def _no_bounds(a: dict) -> list[_Bound]:
    return []


def inside() -> bool:
    """Whether this thread is running a checked op (whose inner ops are not checked again)."""
    return getattr(_local, "inside", False)


def _checked_on_host(b: _Bound) -> bool:
    """Check ``b`` on the host's copy of its values, if the host has one (free); whether it did."""
    host = b.index._value[0].host
    if host is None:
        return False
    if b.count:
        total = int(host.sum()) * b.count
        if total >= b.hi:
            raise b.error(total)
        return True
    bad = (host < b.lo) | (host >= b.hi)
    if b.ignore is not None:
        bad &= host != b.ignore
    if bad.any():
        raise b.error(int(host[bad][0]))
    return True


def _check_on_device(bounds: list[_Bound]) -> None:
    """Check the indices' smallest and largest values (``ignore`` taken as ``lo``), computed by one device
    reduction and read on the host in one sync."""
    ends = []
    for b in bounds:
        t = b.index
        if b.count:  # its True count, twice (as its smallest and largest value)
            total = record(aten.sum.default, (t,), {"dtype": torch.int64})
            ends += [total, total]
            continue
        if b.ignore is not None:
            t = record(aten.masked_fill.Scalar, (t, record(aten.eq.Scalar, (t, b.ignore), {}), b.lo), {})
        if t.dtype != torch.int64:  # (one dtype to stack them in)
            t = record(aten._to_copy.default, (t,), {"dtype": torch.int64})
        ends += [record(aten.min.default, (t,), {}), record(aten.max.default, (t,), {})]
    both = record(aten.stack.default, (ends,), {})
    metrics.inc("index_checks")
    with metrics.timer("index_check"):
        values = lazy_to_cpu(both, reason="index bounds check (config.check_indices, eager mode)").tolist()
    for b, lo, hi in zip(bounds, values[::2], values[1::2]):
        lo, hi = (lo * b.count, hi * b.count) if b.count else (lo, hi)
        if lo < b.lo:
            raise b.error(lo)
        if hi >= b.hi:
            raise b.error(hi)
