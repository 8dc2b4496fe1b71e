"""``lazyxla.compile``: a region of code that becomes one program, with promises checked.

Example::

    @lazyxla.compile(full_graph=True, max_different_graphs=1)
    def train_step(x, y):
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

from lazyxla.config import config
from lazyxla.lazy import eager
from lazyxla.lazy.capture import StepCapture
from lazyxla.lazy.graph import sync
from lazyxla.observe import diagnostics
from lazyxla.observe.diagnostics import CompileRegionError


class compile:  # noqa: N801  (used like a function: lazyxla.compile(...))
    """Run a region (a function, or a ``with`` block) as one lazyxla program.

    Pending work is synced before the region, the region is recorded, and synced at its end.
    ``full_graph=True``: anything inside that forces an execution (``.item()``, ``.cpu()``, ``print``, a
    CPU fallback, a data-dependent shape) raises :class:`CompileRegionError` at that line.
    ``max_different_graphs=N``: the region may produce at most N distinct graphs over all its runs;
    one more raises, saying where the new graph differs from the previous one. ``name`` identifies the
    region (default: the function's qualified name, or the ``with`` statement's line). In eager mode
    (``lazyxla.eager_mode``) the region is still one program: eager mode is off inside it.

    ``capture=True`` (a function only): whole-step capture. Once two recorded calls from the same state have
    given the same program with the same numbers, a call from that state is *replayed*: guards are checked, the
    cached program runs on the current buffers and its results are put where recording would put them, without
    running the function's Python (``lazyxla/lazy/capture.py`` says what is guarded and what is not replayed).
    Optimizers that offer ``capturable`` are switched to it, as ``torch.compile`` does. ``capture_status``
    says whether calls are replayed, or why not. ``capture=None`` (the default): capture when
    ``lazyxla.config.capture`` (``LAZYXLA_CAPTURE=1``) is on when the function is wrapped.

    Example::

        with lazyxla.compile(full_graph=True):
            loss = model(x).sum()
            loss.backward()

        @lazyxla.compile(capture=True)
        def train_step(x, y):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
    """

    def __init__(
        self,
        fn: Callable | None = None,
        *,
        full_graph: bool = False,
        max_different_graphs: int | None = None,
        name: str | None = None,
        capture: bool | None = None,
    ) -> None:
        if max_different_graphs is not None and max_different_graphs < 1:
            raise ValueError(f"lazyxla.compile: max_different_graphs must be at least 1, got {max_different_graphs}")
        self.fn = fn
        self.full_graph = full_graph
        self.max_graphs = max_different_graphs
        self.name = name or (getattr(fn, "__qualname__", None) if fn is not None else None)
        self._active: list[tuple[diagnostics.Region, contextlib.AbstractContextManager]] = []
        self.capture = capture
        self._capture = None
        if fn is not None:
            functools.update_wrapper(self, fn)
            if capture or (capture is None and config.capture):  # (None: lazyxla.config.capture decides)
                self._capture = StepCapture(fn)

    @property
    def capture_status(self) -> str:
        """With ``capture=True``: whether calls are replayed, or why the last recorded call cannot be.

        Example::

            print(train_step.capture_status)    # 'replaying', or 'recorded, not captured: <why>'
        """
        if self._capture is None:
            raise ValueError(
                "capture_status: this lazyxla.compile function does not capture: make it with capture=True (or "
                "while lazyxla.config.capture is on)"
            )
        return self._capture.status

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fn is None:  # @lazyxla.compile(...) with options: wrap the function
            (fn,) = args
            options = {"full_graph": self.full_graph, "max_different_graphs": self.max_graphs, "name": self.name}
            return compile(fn, capture=self.capture, **options)
        if self._capture is not None:
            return self._capture(self, args, kwargs)
        with self:
            return self.fn(*args, **kwargs)

    def __enter__(self) -> compile:
        lazy = eager.disabled()  # (as torch_xla.compile: a region is traced lazily even in eager mode)
        lazy.__enter__()
        try:
            sync()
        except BaseException:
            lazy.__exit__(None, None, None)
            raise
        name = self.name or diagnostics.user_frame(2)
        region = diagnostics.Region(name, self.full_graph, self.max_graphs)
        self._active.append((region, lazy))
        diagnostics.enter(region)
        return self

    def __exit__(self, kind, value, tb) -> None:
        region, lazy = self._active.pop()
        try:
            if kind is None:
                region.closing = True
                sync()
        finally:
            diagnostics.leave(region)
            lazy.__exit__(None, None, None)


__all__ = ["CompileRegionError", "compile"]
