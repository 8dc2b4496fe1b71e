"""``torch_xla._internal.jax_workarounds`` on lazyxla: torch_xla's guards around importing jax, which lazyxla is
built on, so they have nothing to guard: ``jax_import_guard()`` does nothing, ``requires_jax`` returns the function,
``maybe_get_jax()`` returns jax. ``maybe_get_torchax()`` returns None: lazyxla does not use torchax.

Example::

    from torch_xla._internal.jax_workarounds import jax_import_guard, requires_jax
    jax_import_guard()
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from lazyxla.compat._common import missing_attribute


def jax_import_guard() -> None:
    """Nothing to do on lazyxla (torch_xla's keeps jax from taking the TPU first).

    Example::

        jax_import_guard()
    """


def requires_jax(func: Callable) -> Callable:
    """``func`` itself: jax is always importable with lazyxla.

    Example::

        @requires_jax
        def f(x): ...
    """
    return func


def maybe_get_jax(log: bool = True):
    """The ``jax`` module.

    Example::

        jax = maybe_get_jax()
    """
    return jax


def maybe_get_torchax():
    """None: lazyxla runs JAX functions through ``lazyxla.call_jax``, not torchax.

    Example::

        assert maybe_get_torchax() is None
    """
    return None


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
