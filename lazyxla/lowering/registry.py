"""The op vocabulary: ``@lowers(torch.ops.aten.X.overload)`` rows mapping an aten op to a jax rule.

A rule is a pure function ``rule(ctx, *args, **kwargs)`` taking the op's arguments with tensors
replaced by ``jax.Array`` and returning an array, or a tuple/list of arrays for multi-output ops.
``ctx`` carries what a rule may need besides its arguments (output avals, the RNG key), so rules
never read module globals.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from lazyxla.device.devices import np_dtype
from lazyxla.torch_private import OpOverload


@dataclasses.dataclass(frozen=True)
class Rule:
    fn: Callable
    random: bool = False  # the rule draws random numbers from ctx.key
    # The dtype the rule's Python-scalar inputs arrive in; None: as PyTorch converts them (the first floating
    # input's dtype, see ``to_jax._scalar_dtype``). Fused optimizer steps take float64, as PyTorch's kernels
    # take their hyperparameters as doubles (0.999 in bfloat16 is 0.996).
    scalars: Any = None
    # How PyTorch's CPU kernel computes this op on half-precision tensors with a Python float operand: None (as
    # the rule does), "float32" (the float taken in float32: ``x * 0.3`` is a float32 product, rounded once) or
    # "rounded" (the float rounded to the tensor's dtype, then float32 math: ``torch.add(x, y, alpha=0.3)``).
    # See ``opmath_scalars``.
    opmath: str | None = None


# ``Rule.scalars`` for a rule that hands its Python-scalar inputs on to other rules (a loop's body): floats arrive
# as float64 and ints as int64, as the program packs them, and each op of the body converts them its own way.
PACKED = "packed"


@dataclasses.dataclass
class Ctx:
    """What a rule knows besides its arguments."""

    avals: tuple  # output avals (shape, torch dtype), as PyTorch's meta kernels computed them
    key: Any = None  # a jax PRNG key, for rules registered with random=True
    axis: str | None = None  # the replica mesh axis, inside a program that spans the run's replicas
    world: int = 1  # replicas in that program

    @property
    def shape(self) -> tuple[int, ...]:
        return self.avals[0].shape

    @property
    def dtype(self) -> np.dtype:
        """The numpy/jax dtype of the first output."""
        return np_dtype(self.avals[0].dtype)


RULES: dict[OpOverload, Rule] = {}


def lowers(*ops: OpOverload, random: bool = False, scalars: Any = None) -> Callable:
    """Register ``fn`` as the lowering rule of each op; registering an op twice raises. ``random``: the rule
    draws from ``ctx.key``; ``scalars``: the numpy dtype its Python-scalar inputs arrive in (see ``Rule``).

    Example::

        @lowers(aten.sin.default)
        def _sin(ctx, x):
            return jnp.sin(x)
    """

    def register(fn: Callable) -> Callable:
        for op in ops:
            if not isinstance(op, OpOverload):
                raise TypeError(f"@lowers takes torch.ops.aten.<op>.<overload> objects, got {op!r}")
            if op in RULES:
                raise ValueError(f"{op} already has a lowering rule ({RULES[op].fn.__qualname__})")
            RULES[op] = Rule(fn, random, scalars)
        return fn

    return register


def opmath_scalars(*ops: OpOverload, scalar: str = "float32") -> None:
    """Mark the rules of ``ops`` (registered already) as computing in float32, rounding the result once, when a
    Python float meets bfloat16/float16 tensors, as PyTorch's CPU kernels do for these ops; ``scalar``: the
    float taken in ``"float32"``, or ``"rounded"`` to the tensor's dtype first.

    Example::

        opmath_scalars(aten.mul.Tensor)     # bf16_tensor * 0.3: float32 product, rounded to bfloat16
    """
    if scalar not in ("float32", "rounded"):
        raise ValueError(f"opmath_scalars: scalar must be 'float32' or 'rounded', got {scalar!r}")
    for op in ops:
        RULES[op] = dataclasses.replace(RULES[op], opmath=scalar)


def rule_for(op: OpOverload) -> Rule | None:
    return RULES.get(op)
