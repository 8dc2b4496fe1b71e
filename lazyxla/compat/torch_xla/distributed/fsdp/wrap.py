"""``torch_xla.distributed.fsdp.wrap`` on lazyxla: auto-wrap policies and the recursive wrapper.

A policy is called as ``policy(module=m, recurse=..., unwrapped_params=n)``. With ``recurse=True`` it says
whether to look into ``m``'s children; with ``recurse=False`` whether to wrap ``m`` (the remainder of its
parameters not already wrapped further down) in its own FSDP unit. ``XlaFullyShardedDataParallel(model,
auto_wrap_policy=...)`` applies :func:`recursive_wrap` to the model's children; the root unit takes whatever
is left.

Example::

    from functools import partial
    from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP
    from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
    policy = partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
    model = FSDP(GPT(), auto_wrap_policy=policy)      # one unit per Block, the root holds the rest
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from lazyxla.compat._common import missing_attribute


def always_wrap_policy(*args, **kwargs) -> bool:
    """Recurse everywhere and wrap every submodule in its own unit.

    Example::

        model = FSDP(model, auto_wrap_policy=always_wrap_policy)
    """
    return True


def lambda_auto_wrap_policy(module: nn.Module, recurse: bool, unwrapped_params: int, lambda_fn: Callable) -> bool:
    """Recurse everywhere; wrap the modules for which ``lambda_fn(module)`` is true.

    Example::

        policy = partial(lambda_auto_wrap_policy, lambda_fn=lambda m: isinstance(m, nn.Linear))
    """
    return True if recurse else bool(lambda_fn(module))


def transformer_auto_wrap_policy(
    module: nn.Module, recurse: bool, unwrapped_params: int, transformer_layer_cls: set[type[nn.Module]]
) -> bool:
    """Recurse everywhere; wrap the instances of ``transformer_layer_cls`` (the model's layer classes).

    Example::

        policy = partial(transformer_auto_wrap_policy, transformer_layer_cls={GPT2Block})
    """
    return True if recurse else isinstance(module, tuple(transformer_layer_cls))


def size_based_auto_wrap_policy(
    module: nn.Module,
    recurse: bool,
    unwrapped_params: int,
    min_num_params: int = int(1e8),
    force_leaf_modules: set[type[nn.Module]] | None = None,
    exclude_wrap_modules: set[type[nn.Module]] | None = None,
) -> bool:
    """Wrap a module whose not-yet-wrapped parameters number at least ``min_num_params``.

    The search goes into a large enough module unless it is a ``force_leaf_modules`` type (default
    ``size_based_auto_wrap_policy.FORCE_LEAF_MODULES``: ``nn.MultiheadAttention``); a module of an
    ``exclude_wrap_modules`` type (default ``EXCLUDE_WRAP_MODULES``: ``nn.ModuleList``, ``nn.ModuleDict``, which
    have no forward) is never wrapped itself.

    Example::

        policy = partial(size_based_auto_wrap_policy, min_num_params=10_000)
    """
    if force_leaf_modules is None:
        force_leaf_modules = size_based_auto_wrap_policy.FORCE_LEAF_MODULES
    if exclude_wrap_modules is None:
        exclude_wrap_modules = size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES
    large = unwrapped_params >= min_num_params
    if recurse:
        return large and not isinstance(module, tuple(force_leaf_modules))
    return large and not isinstance(module, tuple(exclude_wrap_modules))


size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES = {nn.ModuleList, nn.ModuleDict}
size_based_auto_wrap_policy.FORCE_LEAF_MODULES = {nn.MultiheadAttention}


def _wrap(module: nn.Module, wrapper_cls: Callable, **kwargs) -> nn.Module:
    # a module may carry its own FSDP options (torch_xla reads `_wrap_overrides`, e.g. no mixed precision for BN)
    overrides = getattr(module, "_wrap_overrides", None)
    return wrapper_cls(module, **{**kwargs, **overrides}) if overrides else wrapper_cls(module, **kwargs)


def recursive_wrap(
    module: nn.Module,
    auto_wrap_policy: Callable,
    wrapper_cls: Callable,
    ignored_modules: set[nn.Module],
    ignored_params: set[nn.Parameter],
    only_wrap_children: bool = False,
    **kwargs: Any,
) -> tuple[nn.Module, int]:
    """Wrap ``module``'s submodules (and, unless ``only_wrap_children``, ``module`` itself) with
    ``wrapper_cls(submodule, **kwargs)`` where ``auto_wrap_policy`` says so, depth first; returns the
    (possibly wrapped) module and how many parameters were wrapped.

    Example::

        model, wrapped = recursive_wrap(model, always_wrap_policy, FSDP, set(), set(), only_wrap_children=True)
    """
    if auto_wrap_policy is None or wrapper_cls is None:
        raise ValueError("recursive_wrap needs an auto_wrap_policy and a wrapper_cls")
    if isinstance(wrapper_cls, type):
        for _, child in module.named_modules():
            if child not in ignored_modules and isinstance(child, wrapper_cls):
                raise ValueError(f"recursive_wrap: {type(child).__name__} is already wrapped")
    num_params = sum(p.numel() for p in module.parameters() if p not in ignored_params)
    if not auto_wrap_policy(module=module, recurse=True, unwrapped_params=num_params):
        return module, 0
    wrapped = 0
    for name, child in module.named_children():
        if child in ignored_modules:
            continue
        new_child, n = recursive_wrap(child, auto_wrap_policy, wrapper_cls, ignored_modules, ignored_params, **kwargs)
        setattr(module, name, new_child)
        wrapped += n
    if not only_wrap_children and auto_wrap_policy(module=module, recurse=False, unwrapped_params=num_params - wrapped):
        return _wrap(module, wrapper_cls, **kwargs), num_params
    return module, wrapped


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
