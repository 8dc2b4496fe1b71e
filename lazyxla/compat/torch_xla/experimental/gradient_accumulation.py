"""``torch_xla.experimental.gradient_accumulation`` on lazyxla: accumulate gradients over micro-batches in ONE
loop of the XLA program (``lazyxla.scan``), the model's forward and backward traced once.

``gradient_accumulation(train_step, iterable_tensors, model, *carried_tensors)`` runs
``train_step(*slices, *carried)`` for each index of the iterable tensors' leading dimension, divides each
loss by the number of steps, back-propagates it, and sums the parameters' gradients, as the Python loop::

    total = 0
    for i in range(n):
        loss, *carried = train_step(*(t[i] for t in iterable_tensors), *carried)
        (loss / n).backward()
        total += (loss / n).detach()

would, but compiled as one loop body whatever ``n``. The summed gradients are added to the parameters'
``.grad`` (set where it was None); it returns the accumulated loss, followed by the final carried tensors
when there are any.

How: the loop is a ``lazyxla.scan`` whose carry holds the loss sum, one gradient sum per trainable
parameter and the carried tensors. Its body calls ``train_step`` with autograd on and reads the parameters'
gradients of that one iteration (the parameters are loop invariants: read, never modified). Random ops draw
different numbers in each iteration (``lazyxla.scan``'s per-iteration keys), as torch_xla forks a seed per
iteration. ``train_step`` must be pure: modifying one of its inputs in place raises ``AssertionError``, as in
torch_xla.

Example::

    from torch_xla.experimental.gradient_accumulation import gradient_accumulation

    def train_step(x, y, seen):
        loss = F.mse_loss(model(x), y)
        return loss, seen + 1

    # data: (4, batch, features): 4 micro-batches, one compiled loop
    loss, seen = gradient_accumulation(train_step, (data, target), model, torch.tensor(0, device=dev))
    optimizer.step()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from lazyxla.compat._common import missing_attribute
from lazyxla.frontend import scan as _scan
from lazyxla.lazy.tensor import unwrap


@dataclass(frozen=True)
class GradientAccumulationContext:
    """The loop's sizes: steps (the iterable tensors' leading size), iterable and carried tensor counts.

    Example::

        GradientAccumulationContext(num_gradient_steps=4, num_iterable_tensors=2, num_carried_tensors=1)
    """

    num_gradient_steps: int
    num_iterable_tensors: int
    num_carried_tensors: int


def gradient_accumulation(
    train_step: Callable, iterable_tensors: Sequence[torch.Tensor], model: torch.nn.Module, *carried_tensors
):
    """Run ``train_step`` over the leading dimension of ``iterable_tensors`` in one compiled loop, adding the
    summed gradients of ``loss / steps`` to ``model``'s parameters' ``.grad``. ``train_step(*slices,
    *carried)`` returns the loss, or ``(loss, *new_carried)`` when carried tensors are given. Returns the
    accumulated loss (``(loss, *carried)`` with carried tensors). Raises ``ValueError`` for no iterable
    tensors, an empty one, one that is not a tensor or leading sizes that differ.

    Example::

        def step(x, y):
            return F.cross_entropy(model(x), y)
        loss = gradient_accumulation(step, (inputs, labels), model)     # inputs: (micro_batches, B, ...)
    """
    if not iterable_tensors:
        raise ValueError("iterable_tensors cannot be empty")
    steps = iterable_tensors[0].size(0)
    for i, t in enumerate(iterable_tensors):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"Element {i} of iterable_tensors is not a tensor")
        if t.numel() == 0:
            raise ValueError(f"Element {i} of iterable_tensors is empty")
        if t.size(0) != steps:
            raise ValueError(f"Element {i} of iterable_tensors has inconsistent first dimension")
    context = GradientAccumulationContext(steps, len(iterable_tensors), len(carried_tensors))
    return _accumulate(context, train_step, list(iterable_tensors), model, list(carried_tensors))


def _identities(tensors: list) -> list:
    """What each lazy tensor holds now: an in-place op replaces it (how a body's purity is checked)."""
    return [unwrap(t)._value[0] for t in tensors]


def _body(context: GradientAccumulationContext, train_step: Callable, params: list[torch.nn.Parameter]):
    """One iteration as a scan body: carry (loss sum, gradient sums, carried) -> new carry."""

    def iteration(carry, slices):
        loss_sum, grad_sums, carried = carry
        inputs = [*slices, *carried]
        before = _identities(inputs)
        saved = [p.grad for p in params]
        for p in params:
            p.grad = None  # this iteration's gradients alone
        with torch.enable_grad():  # the scan runs without autograd; the iteration's own backward needs it
            result = train_step(*slices, *carried)
            loss, new_carried = (result, []) if not context.num_carried_tensors else (result[0], list(result[1:]))
            loss = loss / context.num_gradient_steps
            loss.backward()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        for p, g in zip(params, saved):
            p.grad = g
        assert _identities(inputs) == before, (
            "gradient_accumulation: train_step modified one of its input tensors in place; it must be pure "
            "(return new carried tensors instead)"
        )
        new_sums = [s + g.detach() for s, g in zip(grad_sums, grads)]
        return (loss_sum + loss.detach().float(), new_sums, [t.detach() for t in new_carried]), None

    return iteration


def _accumulate(context: GradientAccumulationContext, train_step, iterable_tensors, model, carried_tensors):
    params = [p for p in model.parameters() if p.requires_grad]
    device = iterable_tensors[0].device
    init = (
        torch.zeros((), dtype=torch.float32, device=device),
        [torch.zeros_like(p, requires_grad=False) for p in params],
        [t.detach() for t in carried_tensors],
    )
    xs = [t.detach() for t in iterable_tensors]
    with torch.no_grad():  # gradients are the loop's carries, not autograd through the loop
        (loss, grads, carried), _ = _scan.scan(_body(context, train_step, params), init, xs)
    for p, g in zip(params, grads):
        if p.grad is None:
            p.grad = g
        else:
            p.grad.add_(g)
    return (loss, *carried) if carried_tensors else loss


def __getattr__(name: str):
    raise missing_attribute(__name__, name)


__all__ = ["GradientAccumulationContext", "gradient_accumulation"]
