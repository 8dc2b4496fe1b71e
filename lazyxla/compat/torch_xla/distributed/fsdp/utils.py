"""``torch_xla.distributed.fsdp.utils`` on lazyxla: ``checkpoint_module`` (gradient checkpointing of a module).

Example::

    from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP, checkpoint_module
    wrapper = lambda m, *args, **kwargs: FSDP(checkpoint_module(m), *args, **kwargs)
    model = FSDP(model, auto_wrap_policy=policy, auto_wrapper_callable=wrapper)
"""

from __future__ import annotations

from types import MethodType

import torch
from torch import nn

from lazyxla.compat._common import missing_attribute
from lazyxla.compat.torch_xla.utils.checkpoint import checkpoint


def _forward_unpacked(module: nn.Module, num_args: int, num_kwargs: int, *packed):
    # torch_xla's checkpoint takes positional arguments only: keyword arguments travel as names, then values
    args, rest = packed[:num_args], packed[num_args:]
    return module._xla_checkpointed_forward_original(*args, **dict(zip(rest[:num_kwargs], rest[num_kwargs:])))


def _checkpointed_forward(module: nn.Module, *args, **kwargs):
    packed = args + tuple(kwargs) + tuple(kwargs.values())
    if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in packed):
        # nothing to recompute for: the re-entrant checkpoint would give the parameters no gradient
        return module._xla_checkpointed_forward_original(*args, **kwargs)
    return checkpoint(module._xla_checkpointed_forward_no_kwargs, len(args), len(kwargs), *packed)


def checkpoint_module(module: nn.Module) -> nn.Module:
    """Make ``module``'s forward recompute its activations in backward instead of keeping them (when an input
    requires grad); returns ``module`` itself. Wrap it with FSDP after this, not before.

    Example::

        block = FSDP(checkpoint_module(block))
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"checkpoint_module takes an nn.Module, got {type(module).__name__}")
    module._xla_checkpointed_forward_original = module.forward
    module._xla_checkpointed_forward_no_kwargs = MethodType(_forward_unpacked, module)
    module.forward = MethodType(_checkpointed_forward, module)
    return module


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
