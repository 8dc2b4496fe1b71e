"""``torch_xla.utils.checkpoint`` on lazyxla: activation checkpointing.

``checkpoint(function, *args)`` runs ``function`` without keeping its activations and runs it again in backward
to compute them (the re-entrant form, torch_xla's default), replaying the RNG state of the forward. It is
``torch.utils.checkpoint.checkpoint``, which lazyxla supports as it is; ``use_reentrant=False`` (which torch_xla
refuses) works as well.

Example::

    from torch_xla.utils.checkpoint import checkpoint
    y = checkpoint(block, x)             # block's activations are recomputed in backward
"""

from __future__ import annotations

from collections.abc import Callable

import torch.utils.checkpoint

from lazyxla.compat._common import missing_attribute


def checkpoint(function: Callable, *args, use_reentrant: bool = True, **kwargs):
    """``function(*args)``, its activations recomputed in backward; ``preserve_rng_state`` (default True) is
    the only other keyword.

    Example::

        out = checkpoint(layer, hidden_states)
    """
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=use_reentrant, preserve_rng_state=preserve)


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
