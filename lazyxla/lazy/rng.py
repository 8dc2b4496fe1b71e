"""The device RNG: a seed per process and a counter; each random op gets its own key as a graph input.

The key is an input (not a constant), so a new seed or a new step never recompiles; the counter makes
every random op in every step draw fresh numbers.
"""

from __future__ import annotations

import numpy as np
import torch

from lazyxla.ir import Aval, Leaf, leaf
from lazyxla.lazy.session import session

_KEY_AVAL = None


def manual_seed(seed: int) -> None:
    """Start the stream of ``seed`` (its state lives in the session: ``session.seed``, ``session.draws``)."""
    session.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    session.draws = 0


def get_state() -> tuple[int, int]:
    return session.seed, session.draws


def set_state(state: tuple[int, int]) -> None:
    session.seed, session.draws = int(state[0]), int(state[1])


def next_key_leaf(device: int):
    counter = session.draws
    session.draws = counter + 1
    return key_leaf(counter, device)


def key_leaf(counter: int, device: int):
    """The key leaf of the random op numbered ``counter`` in the current seed's stream (``next_key_leaf``
    draws them in order; a replayed step (``lazy/capture.py``) draws the ones its program takes at once)."""
    global _KEY_AVAL
    if _KEY_AVAL is None:
        _KEY_AVAL = Aval((2,), torch.uint32)
    seed = session.seed
    mixed = (seed ^ (seed >> 32)) & 0xFFFFFFFF
    data = np.array([mixed, counter & 0xFFFFFFFF], dtype=np.uint32)
    return leaf(Leaf.RNG, data, _KEY_AVAL, device)


def advance(n: int) -> None:
    """Skip ``n`` keys of the stream, as ``n`` random ops recorded would."""
    session.draws += n
