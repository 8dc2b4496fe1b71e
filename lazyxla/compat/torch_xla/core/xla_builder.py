"""``torch_xla.core.xla_builder`` on lazyxla: ``call_jax``, over :func:`lazyxla.call_jax`.

torch_xla's ``call_jax(jax_func, args, kwargs=None, name=None, override_hash=None)`` takes the positional
arguments as one tuple and the keyword arguments as one dict (lazyxla's takes them spread out). Tensors anywhere
in those pytrees reach ``jax_func`` as ``jax.Array``s; everything else is a static (hashable) argument. The call is
one node of the step's program, differentiable (``jax.vjp``).

Differences from torch_xla: ``name`` (the XLA computation's name) and ``override_hash`` (torch_xla's cache key) are
accepted and ignored: lazyxla keys its plans by the function, its static arguments and the tensors' avals, and
names the computation by its jaxpr's digest, so a function made anew each step hits the cache anyway.
``_JAX_TO_XLA_COMPUTATION_CACHE`` exists (torch_xla's tests clear it) and stays empty. The rest of this module
(torch_xla's ``Op`` builder of XLA computations, ``create_computation``, ``mkop``...) is an HLO builder over
torch_xla's C++ runtime; lazyxla has none: write the computation as a JAX function and call it with
``call_jax``.

Example::

    import torch_xla.core.xla_builder as xb

    def f(a, b):
        return a + jnp.sin(b)

    c = xb.call_jax(f, (a, b))                   # a, b: lazyxla tensors; c: one too, pending until the sync
    d = xb.call_jax(f, (a,), {"b": b})           # keyword arguments as a dict
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lazyxla
from lazyxla.compat._common import missing_attribute, stub
from lazyxla.frontend import jax_interop

_JAX_TO_XLA_COMPUTATION_CACHE: dict = {}  # torch_xla's cache of traced functions; lazyxla keeps its own (stays empty)

# torch_xla's HLO builder: names that build XLA computations op by op on its C++ runtime
_BUILDER = frozenset(
    [
        "Type",
        "Shape",
        "Op",
        "create_builder",
        "mkshape",
        "mkop",
        "mkleaf",
        "mkparam",
        "tensor_shape",
        "create_computation",
        "computation_from_module_proto",
        "get_computation_hlo",
        "xla_computation_as_func",
        "FlattenedInputFunc",
        "CompiledCallableWithCache",
        "JaxFlattenedInputFunc",
        "JaxCallable",
        "XlaCallable",
        "create_placeholder_tensor",
    ]
)


def call_jax(
    jax_func: Callable, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None, name=None, override_hash=None
) -> Any:
    """Call the JAX function ``jax_func(*args, **kwargs)`` on lazyxla tensors, as :func:`lazyxla.call_jax` does.

    ``args``: a tuple (a single non-tuple value is taken as the one argument); ``kwargs``: a dict or None.
    ``name`` and ``override_hash`` are accepted for torch_xla's signature and ignored (see the module's doc).

    Example::

        out = xb.call_jax(lambda d: {"s": d["a"] @ d["b"]}, ({"a": a, "b": b},))      # pytrees in and out
    """
    if not isinstance(args, (tuple, list)):
        args = (args,)
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(
            f"torch_xla.core.xla_builder.call_jax: kwargs must be a dict (or None), got {type(kwargs).__name__}; "
            "positional arguments go in the args tuple"
        )
    return lazyxla.call_jax(jax_func, *args, **(kwargs or {}))


def _jax_to_xla_computation_cache_elements() -> int:
    """How many call signatures ``call_jax`` has traced (lazyxla's plans; torch_xla's tests count cache misses so).

    Example::

        n = xb._jax_to_xla_computation_cache_elements()
    """
    return jax_interop.traced_signatures()


def __getattr__(name: str):
    if name in _BUILDER:
        return stub(
            f"torch_xla.core.xla_builder.{name} (torch_xla's HLO builder)",
            "a JAX function called through torch_xla.core.xla_builder.call_jax or lazyxla.call_jax",
        )
    raise missing_attribute(__name__, name)
