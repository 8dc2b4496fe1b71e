"""``torch_xla.experimental.deprecation`` on lazyxla: keep an old function name working while pointing users
at its replacement.

``deprecated(module, new, old_name)`` returns a function that calls ``new`` and, on its first call only, logs
a warning (``logging.warning``, as torch_xla does) naming ``module.old_name`` and ``new``'s full name.
``mark_deprecated(new)`` is the same as a decorator: the decorated function's body is never run, calls go
to ``new``. ``register_deprecated(module, new)`` puts such a function on ``module`` under ``new``'s name.

Example::

    from torch_xla.experimental.deprecation import deprecated, mark_deprecated

    old_api = deprecated(my_module, new_api, "old_api")     # warns once, then calls new_api

    @mark_deprecated(new_api)
    def old_api(*args): ...                                   # same: calls new_api
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

FN = TypeVar("FN", bound=Callable)


def deprecated(module: ModuleType, new: FN, old_name: str | None = None, extra_msg: str | None = None) -> FN:
    """``new`` under a deprecated name: the first call logs ``"<module>.<old_name> is deprecated. Use
    <new's module>.<new's name> instead."`` (plus ``extra_msg``), every call returns ``new(...)``.

    Example::

        import sys
        old = deprecated(sys.modules[__name__], new_function, "old_function")
        old()          # WARNING: __main__.old_function is deprecated. Use __main__.new_function instead.
    """
    old_name = old_name or new.__name__
    warned = [False]  # once per deprecated function, not per call

    @functools.wraps(new)
    def call_new(*args, **kwargs):
        if not warned[0]:
            warned[0] = True
            message = f"{module.__name__}.{old_name} is deprecated. Use {new.__module__}.{new.__name__} instead."
            logging.warning(f"{message} {extra_msg}" if extra_msg else message)
        return new(*args, **kwargs)

    return call_new


def mark_deprecated(new: FN, extra_msg: str | None = None) -> Callable[[Callable], FN]:
    """A decorator replacing the decorated function by :func:`deprecated` ``(its module, new, its name)``.

    Example::

        @mark_deprecated(torch_xla.runtime.world_size, extra_msg="Removed in 2.9.")
        def xrt_world_size():
            ...
    """

    def replace(old: Callable) -> FN:
        return deprecated(importlib.import_module(old.__module__), new, old_name=old.__name__, extra_msg=extra_msg)

    return replace


def register_deprecated(module: ModuleType, new: FN, extra_msg: str | None = None) -> None:
    """Set ``module.<new's name>`` to :func:`deprecated` ``(module, new)``: the old module keeps the name.

    Example::

        register_deprecated(torch_xla.core.xla_model, torch_xla.runtime.world_size)
    """
    setattr(module, new.__name__, deprecated(module, new, extra_msg=extra_msg))


__all__ = ["deprecated", "mark_deprecated", "register_deprecated"]
