"""``torch_xla.experimental.eager`` on lazyxla: eager mode, each op computed as soon as it is recorded.

``eager_mode(True)`` is ``lazyxla.eager_mode(True)`` (``lazyxla.config.eager``): every op the script sends to
the device is compiled (once per op signature) and run at once, so a failing op raises at its own line, as
torch_xla's debugging mode does. ``torch_xla.compile`` regions and ``torch.compile(backend='openxla')``'d
functions still run as one program (eager mode is off inside a region). ``XLA_USE_EAGER_DEBUG_MODE=1`` turns it
on when ``torch_xla`` is imported. Each op's program is timed as ``EagerOpCompileTime`` (when built) and
``EagerOpExecuteTime`` in ``torch_xla.debug.metrics``; ``ExecuteTime`` times the other programs.

Example::

    import torch_xla
    torch_xla.experimental.eager_mode(True)
    t = torch.randn(5, 5, device=torch_xla.device()) * 5      # two programs, run now

    @torch_xla.compile
    def step(x):                                               # one program
        return torch.cos(torch.sin(x))
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import lazyxla

__all__ = ["eager_mode", "eager_mode_context", "is_eager_mode"]


def eager_mode(enable: bool) -> None:
    """Turn eager mode on or off: each op is computed as it is recorded (``lazyxla.eager_mode``).

    Example::

        torch_xla.experimental.eager_mode(True)
    """
    lazyxla.eager_mode(enable)


def is_eager_mode() -> bool:
    """Whether eager mode is on (False inside ``torch_xla.compile`` regions).

    Example::

        assert torch_xla.experimental.is_eager_mode()
    """
    return lazyxla.is_eager_mode()


@contextlib.contextmanager
def eager_mode_context(enable: bool) -> Iterator[bool]:
    """Eager mode on (or off) inside the block; yields the mode it had before, which comes back after.

    Example::

        with torch_xla.experimental.eager_mode_context(True):
            debug_step()
    """
    saved = is_eager_mode()
    eager_mode(enable)
    try:
        yield saved
    finally:
        eager_mode(saved)
