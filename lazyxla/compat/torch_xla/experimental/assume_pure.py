"""``torch_xla.experimental.assume_pure`` on lazyxla: a pure PyTorch function traced once, its trace reused.

``assume_pure(fn)`` returns a function that records ``fn`` once per signature (the tensors' shapes and dtypes, the
other arguments' values, the pytree structure) and, on later calls, records no op of it: the kept trace is one
loop node of the step's program (a ``lazyxla.scan`` of one iteration with ``pure=True``), its backward (PyTorch's
own backward of ``fn``, traced with it) another. What that saves is host time: per-op recording (dispatch,
functionalization, shape inference) of the function's forward and backward.

``fn`` must be pure: no side effects, no host reads (``.item()``, printing values), results depending only on its
arguments. Tensors it reads from outside (a closure over a parameter) are loop invariants and get no gradient:
pass them as arguments (``PureModule`` does this for a module's parameters and buffers). Random ops: with
``add_rng_seed_argument=True`` the function takes ``rng_seed=`` (an int) and draws its numbers from a device
generator seeded with it (the same seed gives the same numbers; the global RNG's state is left as it was).

Differences from torch_xla (whose ``assume_pure`` goes through torchax and ``xb.call_jax``): the trace is not a
``call_jax`` call, so ``xb._jax_to_xla_computation_cache_elements()`` does not count it.

Example::

    from torch_xla.experimental.assume_pure import PureModule, assume_pure

    @assume_pure
    def mlp(x, w1, w2):
        return torch.relu(x @ w1) @ w2

    y = mlp(x, w1, w2)                  # traced once per signature; later calls record one loop node
    block = PureModule(nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)).to(dev)
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable

import torch
from torch import nn

import lazyxla
from lazyxla.compat._common import missing_attribute
from lazyxla.compat.torch_xla.core import xla_model as xm
from lazyxla.compat.torch_xla.distributed.spmd.xla_sharded_tensor import XLAShardedTensor
from lazyxla.torch_private import tree_flatten, tree_map, tree_unflatten


class _Bodies:
    """fn -> {(pytree spec, static leaves, tensor positions): the loop body} (one body object per signature: scan's
    key for the kept trace). Weakly keyed by ``fn``, and a body holds ``fn`` weakly: a dropped function's traces
    (and a ``PureModule``'s module, held by its ``fn``) are freed with it. A callable that takes no weak reference
    is kept for the process's lifetime.

    Example::

        _BODIES.of(fn)                 # that function's bodies by signature
        _XLA_COMPUTATION_CACHE.clear() # torch_xla's tests do this: the next call traces again
    """

    def __init__(self) -> None:
        self._weak: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._strong: dict = {}

    def of(self, fn: Callable) -> dict:
        try:
            return self._weak.setdefault(fn, {})
        except TypeError:  # no weak reference to it (a builtin, a __slots__ callable)
            return self._strong.setdefault(fn, {})

    def clear(self) -> None:
        self._weak.clear()
        self._strong.clear()

    def __len__(self) -> int:
        return sum(len(bodies) for table in (self._weak, self._strong) for bodies in table.values())


_BODIES = _Bodies()
_XLA_COMPUTATION_CACHE = _BODIES  # torch_xla's name for its cache (its tests clear it: the next call traces again)


def assume_pure(fn: Callable, *, add_rng_seed_argument: bool = False) -> Callable:
    """``fn``, a pure PyTorch function, traced once per signature; later calls reuse the trace (one node).

    ``add_rng_seed_argument=True``: the returned function takes ``rng_seed=`` (an int, required), the seed of the
    random numbers ``fn`` draws.

    Example::

        @assume_pure
        def attention(q, k, v):
            return torch.softmax(q @ k.transpose(-1, -2), -1) @ v

        o = attention(q, k, v)
        add_noise = assume_pure(lambda a: a + torch.rand_like(a), add_rng_seed_argument=True)
        n = add_noise(a, rng_seed=0)
    """
    if not callable(fn):
        raise TypeError(f"assume_pure decorates a function, got {type(fn).__name__}")

    @functools.wraps(fn)
    def pure(*args, **kwargs):
        if not add_rng_seed_argument:
            return _call(fn, args, kwargs)
        if "rng_seed" not in kwargs:
            raise AssertionError("Missing keyword argument rng_seed.")  # torch_xla's error (its tests expect it)
        seed = kwargs.pop("rng_seed")
        with xm.fork_rng():
            xm.set_rng_state(int(seed))
            return _call(fn, args, kwargs)

    return pure


def _call(fn: Callable, args: tuple, kwargs: dict):
    flat, spec = tree_flatten((args, kwargs))
    positions = tuple(i for i, x in enumerate(flat) if isinstance(x, torch.Tensor))
    if not positions:  # nothing to trace over: a function of Python values
        return fn(*args, **kwargs)
    statics = tuple(None if i in positions else x for i, x in enumerate(flat))
    bodies = _BODIES.of(fn)
    try:
        key = (spec, statics, positions)
        body = bodies.get(key)
    except TypeError:
        raise TypeError(
            "assume_pure: a non-tensor argument is not hashable; each value keys its own trace, so pass arrays as "
            "tensors and other values as hashable ones (a tuple instead of a list)"
        ) from None
    if body is None:
        body = bodies.setdefault(key, _body(fn, spec, statics, positions))
    xs = [flat[i].unsqueeze(0) for i in positions]
    _, ys = lazyxla.scan(body, None, xs, pure=True)  # one iteration: the trace, kept (pure=True) and reused
    return tree_map(lambda y: y[0] if isinstance(y, torch.Tensor) else y, ys)


def _body(fn: Callable, spec, statics: tuple, positions: tuple) -> Callable:
    try:
        held = weakref.ref(fn)  # the body lives in _BODIES under fn: a strong reference would keep fn forever
    except TypeError:
        held = lambda: fn  # noqa: E731 (kept for the process's lifetime anyway: _Bodies._strong)

    def body(carry, xs):
        fn = held()  # alive: the caller holds it
        leaves = list(statics)
        for i, t in zip(positions, xs):
            leaves[i] = t
        args, kwargs = tree_unflatten(leaves, spec)
        return carry, tree_map(_global, fn(*args, **kwargs))

    return body


def _global(x):
    """An ``XLAShardedTensor`` (what ``xs.mark_sharding`` returns) as the tensor it wraps: the loop's output."""
    return x.global_tensor if isinstance(x, XLAShardedTensor) else x


def assume_pure_torch(func: Callable, use_cache: bool = False) -> Callable:
    """torch_xla's forward-only variant of :func:`assume_pure` (it builds an XLA computation without torchax); here
    the same as :func:`assume_pure` (gradients work too). ``use_cache`` is accepted: traces are always kept.

    Example::

        with torch.no_grad():
            y = assume_pure_torch(mlp)(x, w1, w2)
    """
    return assume_pure(func)


class PureModule(nn.Module):
    """A module whose forward is pure, run through :func:`assume_pure` with its parameters and buffers as arguments
    (so they get gradients): traced once per input signature.

    Example::

        layer = PureModule(nn.Linear(16, 16)).to(dev)
        y = layer(x)
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self._module = module
        self._pure_forward = assume_pure(functools.partial(_pure_forward, module))

    def forward(self, *args, **kwargs):
        params = dict(self._module.named_parameters())
        buffers = dict(self._module.named_buffers())
        return self._pure_forward(params, buffers, args, kwargs)


def _pure_forward(module, params, buffers, args, kwargs):
    return torch.func.functional_call(module, (params, buffers), args, kwargs)


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
