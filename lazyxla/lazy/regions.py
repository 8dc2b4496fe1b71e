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

from lazyxla.lazy import eager
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

    Example::

        with lazyxla.compile(full_graph=True):
            loss = model(x).sum()
            loss.backward()
    """

    def __init__(
        self,
        fn: Callable | None = None,
        *,
        full_graph: bool = False,
        max_different_graphs: int | None = None,
        name: str | None = None,
    ) -> None:
        if max_different_graphs is not None and max_different_graphs < 1:
            raise ValueError(f"lazyxla.compile: max_different_graphs must be at least 1, got {max_different_graphs}")
        self.fn = fn
        self.full_graph = full_graph
        self.max_graphs = max_different_graphs
        self.name = name or (getattr(fn, "__qualname__", None) if fn is not None else None)
        self._active: list[tuple[diagnostics.Region, contextlib.AbstractContextManager]] = []
        if fn is not None:
            functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fn is None:  # @lazyxla.compile(...) with options: wrap the function
            (fn,) = args
            return compile(fn, full_graph=self.full_graph, max_different_graphs=self.max_graphs, name=self.name)
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
