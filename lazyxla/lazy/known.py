"""Known values: small integer and bool tensors whose values the host already has.

Programs bookkeep with small integer tensors that the host built: ``torch.arange(n, device=dev)``,
``torch.full((b,), True, device=dev)``, ``torch.tensor(eos_id, device=dev)``, token ids copied from the
CPU. Hugging Face's ``generate()`` checks such tensors before its first token (``(eos < 0).any()``,
``torch.isin(eos, pad).any()``, ``(mask == 1).all()``) and advances its ``cache_position`` with them every
token; each check was a host read, so a program compiled and ran for a handful of integers, and each new
constant (the last token's ``torch.full(..., True)``) made the decoding step a new program.

A lazyxla tensor of an integer or bool dtype with at most ``config.known_values_limit`` elements keeps a
CPU copy of its value when the host has it (``remember``): a copy from the CPU, or the result of an op all
of whose tensor inputs are known. Such an op is computed on the host by PyTorch's own CPU kernel
(``fold``), so its numbers, and its errors, are eager PyTorch's, raised at the user's line; its result is
also put on the device at once, as device data, so programs take it as an input (never a baked
constant: a value that changes does not recompile). A host read of a known value (``.item()``,
``.tolist()``, ``.cpu()``, ``bool(t)``) returns the copy: nothing is synced or compiled.

Never folded: floating-point results (the device's arithmetic, not the CPU's, must give them), random
ops, ops outside ``aten`` (collectives), ``empty`` (no value), and transfers. A tensor whose node is
rewritten (a relayout under SPMD) loses its known value, never keeps a stale one: the copy belongs to
the immutable IR node.

Example::

    ids = torch.tensor([[5, 7, 1]], device=dev)
    (ids < 0).any().item()        # computed on the host: no program, no sync
    pos = torch.arange(3, device=dev)[-1:] + 1
    model(ids, cache_position=pos)   # pos is a program input, not a constant
"""

from __future__ import annotations

import torch

from lazyxla.config import config
from lazyxla.device import devices
from lazyxla.ir import Aval, Leaf, Node, leaf
from lazyxla.lazy.tensor import LazyTensor
from lazyxla.observe import diagnostics, metrics
from lazyxla.util import Memo

aten = torch.ops.aten

DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})

# Ops whose output depends on their tensor input's shape and dtype only: a tensor that holds no known value
# (``torch.zeros`` is ``empty`` then ``zero_``) still gives a known result.
_SHAPE_ONLY = frozenset(
    {
        aten.zero.default,
        aten.fill.Scalar,
        aten.zeros_like.default,
        aten.ones_like.default,
        aten.full_like.default,
        aten.new_zeros.default,
        aten.new_ones.default,
        aten.new_full.default,
    }
)
# Ops that take a handler of their own (lazy/special.py) and are still computed on the host when known.
FOLDABLE_SPECIAL = frozenset(
    {
        aten.slice_copy.Tensor,
        aten.select_copy.int,
        aten.select_scatter.default,
        aten.slice_scatter.default,
        aten.nonzero.default,
        aten._to_copy.default,
    }
)
_NEVER = frozenset(
    {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default, aten.new_empty.default}
)


def forget(n: Node) -> None:
    """Drop device data ``n``'s CPU copy, putting the value on the device first: ops on it are then recorded as
    device ops. A captured step (lazy/capture.py) does this for the tensors it reads, whose values a replay
    takes from the device: ops on a batch's token ids computed on the host would be host values a replay has not.

    Example::

        forget(unwrap(ids)._value[0])
    """
    if n.host is not None:
        n.payload  # noqa: B018  (the property puts the value on the device)
        n.host = None


def host_value(t) -> torch.Tensor | None:
    """The CPU copy of a LazyTensor's value, if the host knows it; else None.

    Example::

        host_value(unwrap(torch.arange(3, device=dev)))     # tensor([0, 1, 2])
    """
    return t._value[0].host if type(t) is LazyTensor else None


def knowable(t: torch.Tensor) -> bool:
    """Whether a CPU tensor's value may be kept beside its device copy: an integer or bool dtype, small."""
    return t.dtype in DTYPES and t.numel() <= config.known_values_limit


def upload(t: torch.Tensor, device: int, source: str) -> LazyTensor:
    """A bare LazyTensor on lazyxla device ``device`` holding a copy of the CPU tensor ``t``; a knowable value
    is kept on the host (``t`` itself: the caller gives a tensor nobody else writes to) and put on the device
    only when a program first takes it (``Node.payload``)."""
    devices.check_dense(t)  # before its shape: a nested tensor has none to ask
    aval = Aval(tuple(t.shape), t.dtype)
    if knowable(t):
        n = leaf(Leaf.DATA, None, aval, device)
        n.host = t
    else:
        n = leaf(Leaf.DATA, _to_device(t, device), aval, device)
    n.source = source
    return LazyTensor((n, 0), aval, fresh=True)


def _to_device(t: torch.Tensor, device: int):
    return devices.to_device(t, device)  # timed there (transfer_to_device), as every copy to the device


def _upload_known(n) -> object:
    """``Node.upload``: the device array of a known value, made when a program first takes it."""
    metrics.inc("known_uploads")
    return _to_device(n.host, n.device)


Node.upload = _upload_known


def _foldable(func) -> bool:
    return func.namespace == "aten" and torch.Tag.nondeterministic_seeded not in func.tags and func not in _NEVER


# id(op) -> whether it may be computed on the host: one entry per op used (PyTorch has ~4,000 overloads)
_FOLDABLE = Memo("lazyxla.lazy.known._FOLDABLE", limit=20_000)


def _tensors(x, out: list) -> bool:
    """Collect the LazyTensors in an argument; False if it holds a tensor the host cannot stand in for."""
    if type(x) is LazyTensor:
        out.append(x)
        return True
    if isinstance(x, torch.Tensor):
        return x.dim() == 0 and x.device.type == "cpu"  # a wrapped Python number
    if type(x) is list or type(x) is tuple:
        return all(_tensors(e, out) for e in x)
    return True


def _device_of(func, lazies: list, kwargs) -> int | None:
    """The lazyxla device the op's result lives on; None if the inputs are on several, or it leaves lazyxla."""
    found = {t._value[0].device for t in lazies}
    device = kwargs.get("device")
    if device is not None:
        device = torch.device(device)
        if not devices.on_device(device):
            return None
        found.add(device.index or 0)
    if len(found) > 1:
        return None
    return found.pop() if found else 0


def _on_host(x, shape_only: bool):
    if type(x) is LazyTensor:
        value = x._value[0].host
        if value is None and shape_only:
            return torch.empty(x.shape, dtype=x.dtype)
        return value
    if type(x) is list or type(x) is tuple:
        return type(x)(_on_host(e, shape_only) for e in x)
    if isinstance(x, torch.device):
        return torch.device("cpu")
    return x


def _on_meta(x):
    if type(x) is LazyTensor:
        return torch.empty(x.shape, dtype=x.dtype, device="meta")
    if type(x) is list or type(x) is tuple:
        return type(x)(_on_meta(e) for e in x)
    if isinstance(x, torch.device):
        return torch.device("meta")
    return x


def _key(x):
    """A hashable stand-in for an argument as the meta kernel sees it (a tensor by shape and dtype)."""
    if type(x) is LazyTensor:
        return (x._aval,)
    if type(x) is list or type(x) is tuple:
        return tuple(_key(e) for e in x)
    return (type(x), x)


# (id(op), its arguments' keys) -> whether its outputs are small integer tensors: keyed by shapes and values, which
# may keep changing, so the oldest leave past 100,000 (each entry a tuple of a few shapes)
_results = Memo("lazyxla.lazy.known._results", limit=100_000)


def _small_result(func, args, kwargs, has_inputs: bool) -> bool:
    """Whether ``func``'s outputs are small integer or bool tensors, asked of its meta kernel (memoized by the
    arguments' shapes and values) before the CPU computes anything (``torch.arange(10**9, device=dev)`` and
    ``known.repeat(10**4)`` would be large)."""
    try:
        key = (id(func), _key(args), _key(tuple(sorted(kwargs.items()))))
        found = _results.table.get(key)
    except TypeError:  # an unhashable argument: ask the meta kernel every time
        key = found = None
    if found is None:
        found = _ask_meta(func, args, kwargs, has_inputs)
        if key is not None:
            _results.remember(key, found)
    return found


def _ask_meta(func, args, kwargs, has_inputs: bool) -> bool:
    try:
        out = func(*_on_meta(args), **{k: _on_meta(v) for k, v in kwargs.items()})
    except Exception:  # no meta kernel, or a shape that depends on the data
        # (nonzero, unique): bounded by its known inputs, which are small; a factory is not folded
        return has_inputs
    return _outputs_knowable(out)


def _outputs_knowable(out) -> bool:
    if isinstance(out, torch.Tensor):
        return knowable(out)
    if type(out) is tuple or type(out) is list:
        return all(_outputs_knowable(e) for e in out)
    return out is None or type(out) in (int, bool, float)


def _back(out, device: int, source: str):
    if isinstance(out, torch.Tensor):
        return upload(out.clone(memory_format=torch.contiguous_format), device, source)  # never a view of an input
    if type(out) is tuple or type(out) is list:
        return type(out)(_back(e, device, source) for e in out)
    return out


NOT_FOLDED = object()


def fold(func, args, kwargs):
    """``func`` computed on the host if every tensor input's value is known and every output is a small
    integer or bool tensor: its outputs as LazyTensors holding known values. Else ``NOT_FOLDED``, and the
    op is recorded as usual.

    Example::

        out = fold(aten.add.Tensor, (a, b), {})      # a, b known: a + b on the CPU, put on the device
    """
    if args and type(args[0]) is LazyTensor and args[0]._value[0].host is None and func not in _SHAPE_ONLY:
        return NOT_FOLDED  # the common case, decided at once: an input the host does not know
    limit = config.known_values_limit
    if not limit:
        return NOT_FOLDED
    ok = _FOLDABLE.table.get(id(func))
    if ok is None:
        ok = _FOLDABLE.remember(id(func), _foldable(func))
    if not ok:
        return NOT_FOLDED
    lazies: list = []
    if not (all(_tensors(a, lazies) for a in args) and all(_tensors(v, lazies) for v in kwargs.values())):
        return NOT_FOLDED
    shape_only = func in _SHAPE_ONLY
    for t in lazies:
        if t._value[0].host is None and not (shape_only and t.dtype in DTYPES and t.numel() <= limit):
            return NOT_FOLDED
    device = _device_of(func, lazies, kwargs)
    if device is None or not _small_result(func, args, kwargs, bool(lazies)):
        return NOT_FOLDED
    try:
        out = func(*_on_host(args, shape_only), **{k: _on_host(v, shape_only) for k, v in kwargs.items()})
    except (NotImplementedError, RuntimeError) as e:
        if "not implemented for" in str(e):  # a dtype PyTorch's CPU kernel lacks: the device's rule may have it
            return NOT_FOLDED
        raise
    if not _outputs_knowable(out):
        return NOT_FOLDED
    metrics.inc("ops_folded")
    return _back(out, device, f"computed on the host from known values at {diagnostics.user_frame(3)}")
