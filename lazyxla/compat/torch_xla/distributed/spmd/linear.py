"""torch_xla's einsum ``nn.Linear`` (``apply_xla_patch_to_nn_linear``, ``EinsumLinear``, ``XLAPatchedLinear``).

``F.linear`` on a batch of more than two dimensions flattens it to a matrix, which merges the batch and
sequence dimensions and hides how each was split from XLA's sharding propagation. The patched layer computes
``y = x @ W.T + b`` as one einsum over every leading dimension, forward and backward, so that the dimensions
stay apart. The values equal ``nn.Linear``'s.

Example::

    from torch_xla.distributed.spmd.xla_sharding import apply_xla_patch_to_nn_linear
    model = apply_xla_patch_to_nn_linear(model)      # every nn.Linear inside becomes an EinsumLinear
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["EinsumLinear", "XLAPatchedLinear", "apply_xla_patch_to_nn_linear", "xla_patched_nn_linear_forward"]


class XLAPatchedLinear(torch.autograd.Function):
    """``F.linear(input, weight, bias)`` as einsums that keep every leading dimension of ``input``, with the
    backward pass written the same way.

    Example::

        y = XLAPatchedLinear.apply(x, layer.weight, layer.bias)
    """

    @staticmethod
    def forward(ctx, input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        ctx.save_for_backward(input, weight, bias)
        out = torch.einsum("...n,mn->...m", input, weight)
        return out if bias is None else out + bias

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        input, weight, bias = ctx.saved_tensors
        wants_input, wants_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        wants_bias = bias is not None and ctx.needs_input_grad[2]
        grad_input = torch.einsum("...m,mn->...n", grad_output, weight) if wants_input else None
        grad_weight = torch.einsum("...m,...n->mn", grad_output, input) if wants_weight else None
        grad_bias = torch.einsum("...m->m", grad_output) if wants_bias else None
        return grad_input, grad_weight, grad_bias


def xla_patched_nn_linear_forward(m: nn.Linear, input: Tensor) -> Tensor:
    """``m(input)`` computed by :class:`XLAPatchedLinear`.

    Example::

        y = xla_patched_nn_linear_forward(layer, x)
    """
    return XLAPatchedLinear.apply(input, m.weight, m.bias)


class EinsumLinear(nn.Linear):
    """An ``nn.Linear`` whose forward is :class:`XLAPatchedLinear`.

    Example::

        layer = EinsumLinear(64, 128)
    """

    def forward(self, input: Tensor) -> Tensor:
        return xla_patched_nn_linear_forward(self, input)


def apply_xla_patch_to_nn_linear(module: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` inside ``module`` (at any depth) by an :class:`EinsumLinear` holding the same
    parameters (the same tensors, so optimizers and shardings made before still apply); returns ``module``.

    Example::

        model = apply_xla_patch_to_nn_linear(model)
    """
    for name, child in module.named_children():
        if isinstance(child, nn.Linear) and not isinstance(child, EinsumLinear):
            with torch.device("meta"):  # the parameters are assigned right after: allocate none
                patched = EinsumLinear(child.in_features, child.out_features, bias=child.bias is not None)
            patched.load_state_dict(child.state_dict(keep_vars=True), strict=True, assign=True)
            setattr(module, name, patched)
        else:
            apply_xla_patch_to_nn_linear(child)
    return module
