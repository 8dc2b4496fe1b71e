"""``torch_xla.experimental.scan`` on lazyxla: ``scan(fn, init, xs)`` is one loop in the XLA program
(``lazyxla.scan``): ``fn`` is traced once, for one iteration, forward and backward.

torch_xla's ``partition_fn`` chooses what the backward keeps: ``functorch.compile.default_partition``
(the default) keeps each iteration's activations, ``min_cut_rematerialization_partition`` recomputes them in
the backward (lazyxla's ``checkpoint=True``: it recomputes the whole iteration). ``is_fn_pure=True`` keeps
the trace for later calls, as torch_xla's cache does.

Example::

    from torch_xla.experimental.scan import scan
    final, ys = scan(lambda c, x: (c + x, c + x), torch.zeros(2, device=dev), xs)   # a cumulative sum
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lazyxla.frontend import scan as _scan

# torch_xla's partition functions, by name (functorch's own objects: comparing names spares importing functorch)
_PARTITIONS = {"default_partition": False, "min_cut_rematerialization_partition": True}


def checkpoint_of(partition_fn: Callable | None) -> bool:
    """lazyxla's ``checkpoint`` for one of torch_xla's partition functions (``None``: the default).

    Example::

        from functorch.compile import min_cut_rematerialization_partition
        checkpoint_of(min_cut_rematerialization_partition)        # True: the backward recomputes
    """
    if partition_fn is None:
        return False
    name = getattr(partition_fn, "__name__", None)
    if name not in _PARTITIONS:
        raise NotImplementedError(
            f"torch_xla scan on lazyxla: partition_fn={name or partition_fn!r} is not supported; use "
            "functorch.compile.default_partition (keep activations) or min_cut_rematerialization_partition "
            "(recompute them in the backward, lazyxla.scan(..., checkpoint=True))"
        )
    return _PARTITIONS[name]


def scan(fn: Callable, init: Any, xs: Any, partition_fn: Callable | None = None, is_fn_pure: bool = False):
    """Apply ``fn(carry, x) -> (new_carry, y)`` over the leading dimension of ``xs``; returns the last carry
    and the stacked ``y``s (see ``lazyxla.scan``). Raises ``ValueError`` as torch_xla does: ``fn`` not
    callable, ``xs`` without tensors, leaves of different leading sizes.

    Example::

        def step(carry, x):
            new = carry + x
            return new, new
        final, partial_sums = scan(step, torch.zeros(2, device=dev), torch.ones(3, 2, device=dev))
    """
    return _scan.scan(fn, init, xs, checkpoint=checkpoint_of(partition_fn), pure=is_fn_pure)


__all__ = ["scan"]
