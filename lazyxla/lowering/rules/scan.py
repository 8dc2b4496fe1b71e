"""``lazyxla::scan``: a loop over one traced body, as one op of the lazy IR, lowered to ``jax.lax.scan``.

``lazyxla.scan`` and ``scan_layers`` (``frontend/scan.py``) trace the function once on placeholder tensors,
cut the IR it records into a body (:class:`Body`: the nodes that depend on the iteration, over input leaves
standing for the carries, the iteration's slices, loop invariants and RNG keys), register it here under its
``ir.digest`` (``register``) and record one node per loop: ``scan(inputs, digest, length)``. The rule runs
the body with ``jax.lax.scan``: XLA compiles one iteration, whatever the length. A backward pass is a second
such node, over the body's gradient, run in reverse.

Example::

    register(name, Body(order, leaves, results, (1, 2, 0, 0), reverse=False))   # once per trace
    n = node(OP, inputs, ((tuple(IN[:3]), name, 24), ()), avals, device, base)    # each loop
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lazyxla.lowering import to_jax
from lazyxla.lowering.registry import PACKED, lowers
from lazyxla.ops import ops

OP = ops.scan.default  # declared in lazyxla/ops.py


class Body:
    """One iteration of a loop, as IR: ``order`` (computation nodes, post-order) from ``leaves`` (the
    inputs, in this order: ``counts`` = (carries, per-iteration slices, loop invariants, RNG keys)) to
    ``results`` (the new carries, then the per-iteration outputs the loop stacks). Scalar leaves among the
    invariants are Python numbers, received packed (float64 or int64) and converted by each op using them.
    ``reverse``: the loop runs from the last iteration to the first (a backward pass)."""

    def __init__(self, order: list, leaves: list, results: list, counts: tuple[int, int, int, int], reverse: bool):
        self.order = order
        self.leaves = leaves
        self.results = results
        self.counts = counts
        self.reverse = reverse

    def run(self, inputs: list, length: int, axis=None, world: int = 1) -> list:
        """The loop's results: the final carries, then the stacked per-iteration outputs."""
        n_carry, n_xs, n_inv, _ = self.counts
        carry = tuple(inputs[:n_carry])
        xs = tuple(inputs[n_carry : n_carry + n_xs])
        invariants = inputs[n_carry + n_xs : n_carry + n_xs + n_inv]
        keys = inputs[n_carry + n_xs + n_inv :]
        # each random op draws from its key folded with the iteration number: iterations differ
        index = jnp.arange(length, dtype=np.uint32) if keys else None

        def step(carry, sliced):
            x, i = sliced
            arrays = [*carry, *x, *invariants, *(_fold_in(k, i) for k in keys)]
            env = {id(leaf): (a,) for leaf, a in zip(self.leaves, arrays)}
            to_jax.evaluate(self.order, env, lambda n, m: to_jax.scalar_as(n, m, env[id(m)][0]), axis, world)
            out = [env[id(m)][k] for m, k in self.results]
            return tuple(out[:n_carry]), tuple(out[n_carry:])

        final, stacked = jax.lax.scan(step, carry, (xs, index), length=length, reverse=self.reverse)
        return [*final, *stacked]


def _fold_in(key_data, i):
    """Key data (uint32[2], as random rules take it) for iteration ``i`` of a loop drawing from ``key_data``."""
    key = jax.random.wrap_key_data(key_data, impl="threefry2x32")
    return jax.random.key_data(jax.random.fold_in(key, i))


BODIES: dict[str, Body] = {}  # digest -> body, for the rule


def register(name: str, body: Body) -> None:
    """Make the body named ``name`` (its ``ir.digest``) lowerable as ``scan(..., name, length)``."""
    BODIES.setdefault(name, body)


@lowers(OP, scalars=PACKED)
def _scan(ctx, inputs, body, length):
    """A loop: ``length`` iterations of the registered body, one ``jax.lax.scan``."""
    traced = BODIES.get(body)
    if traced is None:
        raise RuntimeError(f"lazyxla: no scanned body {body} in this process (a scan traced by another run?)")
    return traced.run(list(inputs), length, ctx.axis, ctx.world)
