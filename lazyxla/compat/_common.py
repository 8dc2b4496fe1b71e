"""Helpers shared by the torch_xla compatibility modules (not part of torch_xla's surface)."""

from __future__ import annotations

from typing import NoReturn

import lazyxla

MIGRATION_DOC = "docs/migrating-from-torch_xla.md"


def unsupported(name: str, alternative: str) -> NoReturn:
    """Raise ``NotImplementedError`` for torch_xla's ``name``, naming what to use on lazyxla instead.

    Example::

        unsupported("torch_xla.core.xla_model.send", "lazyxla.collective_permute(t, pairs)")
    """
    raise NotImplementedError(
        f"{name} is not supported by lazyxla's torch_xla compatibility layer; use {alternative} instead "
        f"(see {MIGRATION_DOC})"
    )


def stub(name: str, alternative: str):
    """A function that raises :func:`unsupported` for ``name`` when called (with any arguments).

    Example::

        send = stub("torch_xla.core.xla_model.send", "lazyxla.collective_permute")
    """

    def call(*args, **kwargs) -> NoReturn:
        unsupported(name, alternative)

    call.__name__ = name.rsplit(".", 1)[-1]
    call.__qualname__ = call.__name__
    call.__doc__ = (
        f"Not supported on lazyxla: raises NotImplementedError. Use {alternative}.\n\nExample::\n\n    {alternative}\n"
    )
    return call


def missing_attribute(module: str, name: str) -> AttributeError:
    """The AttributeError for a torch_xla name this layer does not provide.

    Example::

        def __getattr__(name): raise missing_attribute(__name__, name)
    """
    public = module.removeprefix("lazyxla.compat.")
    return AttributeError(
        f"module {public!r} has no attribute {name!r}: lazyxla's torch_xla compatibility layer does not "
        f"provide it (see {MIGRATION_DOC})"
    )


def platform_name() -> str:
    """torch_xla's name for the hardware behind the lazyxla device: 'CPU', 'CUDA' or 'TPU'.

    Example::

        assert platform_name() in ("CPU", "CUDA", "TPU")
    """
    p = lazyxla.platform()
    return {"cpu": "CPU", "gpu": "CUDA", "cuda": "CUDA", "rocm": "ROCM", "tpu": "TPU"}.get(p, p.upper())
