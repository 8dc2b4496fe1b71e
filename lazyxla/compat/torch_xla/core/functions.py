"""``torch_xla.core.functions``: collectives that autograd can differentiate, and what torch_xla builds on them.

``xm.all_reduce`` and ``xm.all_gather`` are not differentiable; these are. Their backward passes follow
torch_xla's: the gradient a replica gets is the gradient of *its own* loss with respect to *its own* input,
computed without communication —

* ``all_reduce(SUM)``: the incoming gradient times ``scale``; ``MUL``: times the product of the other
  replicas' values (``output / input``, 0 where the input is 0); ``MIN``/``MAX``: the gradient where this
  replica's value is the result, 0 elsewhere;
* ``all_gather``: this replica's slice of the incoming gradient;
* ``reduce_scatter`` (a lazyxla addition, torch_xla has none here): the incoming gradient times ``scale``
  in this replica's slice, 0 in the others'.

``AllReduceSumLayer`` is the other convention (the gradient of the sum of every replica's loss): its
backward all-reduces the gradient. ``SyncBatchNorm`` uses it, as in torch_xla.

Example::

    import torch_xla.core.functions as xf
    total = xf.all_reduce(xm.REDUCE_SUM, local_loss)       # differentiable
    total.backward()
"""

from __future__ import annotations

import torch

from lazyxla.compat._common import missing_attribute
from lazyxla.compat.torch_xla import runtime as xr
from lazyxla.compat.torch_xla.core import xla_model as xm

__all__ = [
    "AllGather",
    "AllReduce",
    "AllReduceSumLayer",
    "ReduceScatter",
    "SyncBatchNorm",
    "all_gather",
    "all_reduce",
    "distributed_mm",
    "reduce_scatter",
]


def _reduce_grad(reduce_type, grad, x, out):
    """The backward of ``out = reduce(x over replicas)`` for this replica's own ``x``."""
    if reduce_type == xm.REDUCE_SUM:
        return grad
    if reduce_type == xm.REDUCE_MUL:  # d(prod)/dx = prod of the others = out / x (0 where x is 0)
        return grad * torch.where(x != 0, out / x, torch.zeros_like(x))
    if reduce_type in (xm.REDUCE_MIN, xm.REDUCE_MAX):  # the gradient goes to the replicas holding the result
        return torch.where(x == out, grad, torch.zeros_like(grad))
    raise RuntimeError(f"all_reduce: no gradient for reduce type {reduce_type!r} (SUM, MUL, MIN or MAX)")


class AllReduce(torch.autograd.Function):
    """``xm.all_reduce`` with a backward pass (see the module's docstring); :func:`all_reduce` calls it.

    Example::

        y = xf.AllReduce.apply(x, xm.REDUCE_SUM, 1.0, None)
    """

    @staticmethod
    def forward(ctx, input, reduce_type, scale, groups):
        ctx.reduce_type, ctx.scale = reduce_type, scale
        output = xm.all_reduce(reduce_type, input, scale=scale, groups=groups)
        ctx.save_for_backward(input, output)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, output = ctx.saved_tensors
        grad = grad_output * ctx.scale if ctx.scale != 1.0 else grad_output
        return _reduce_grad(ctx.reduce_type, grad, input, output), None, None, None


def all_reduce(reduce_type, value, scale: float = 1.0, groups=None):
    """``xm.all_reduce(reduce_type, value, scale, groups)`` (one tensor) that autograd differentiates.

    Example::

        mean = xf.all_reduce(xm.REDUCE_SUM, x, scale=1.0 / xr.world_size())
    """
    return AllReduce.apply(value, reduce_type, scale, groups)


def _block(size: int, position: int, device: torch.device) -> torch.Tensor:
    """The indices ``position * size ... + size - 1`` as a device tensor computed from a transferred value, so
    that every replica runs the same program: a replica program spans all replicas (``lowering/replica.py``),
    and a slice at a replica-dependent offset would make each replica's program different."""
    start = torch.tensor(position * size, device=device)
    return torch.arange(size, device=device) + start


class AllGather(torch.autograd.Function):
    """``xm.all_gather`` with a backward pass (this replica's slice of the gradient); :func:`all_gather` calls it.

    Example::

        y = xf.AllGather.apply(x, 0)
    """

    @staticmethod
    def forward(ctx, input, dim):
        ctx.dim, ctx.ordinal, ctx.world = dim, xr.global_ordinal(), xr.world_size()
        return xm.all_gather(input, dim=dim)

    @staticmethod
    def backward(ctx, grad_output):
        size = grad_output.size(ctx.dim) // ctx.world
        return grad_output.index_select(ctx.dim, _block(size, ctx.ordinal, grad_output.device)), None


def all_gather(value, dim: int = 0):
    """``xm.all_gather(value, dim)`` that autograd differentiates.

    Example::

        everyone = xf.all_gather(features, dim=0)      # (world * n, ...)
    """
    return AllGather.apply(value, dim)


class ReduceScatter(torch.autograd.Function):
    """``xm.reduce_scatter`` with a backward pass (the gradient in this replica's slice); :func:`reduce_scatter`
    calls it.

    Example::

        shard = xf.ReduceScatter.apply(x, xm.REDUCE_SUM, 1.0, 0, xr.world_size(), None)
    """

    @staticmethod
    def forward(ctx, input, reduce_type, scale, scatter_dim, shard_count, groups):
        if reduce_type != xm.REDUCE_SUM:
            raise RuntimeError(f"reduce_scatter: no gradient for reduce type {reduce_type!r} (only SUM)")
        ctx.scale, ctx.dim, ctx.shape = scale, scatter_dim % input.dim(), input.shape
        ctx.index = _index_in_group(groups)
        return xm.reduce_scatter(reduce_type, input, scale, scatter_dim, shard_count, groups=groups)

    @staticmethod
    def backward(ctx, grad_output):
        block = _block(grad_output.size(ctx.dim), ctx.index, grad_output.device)
        grad = grad_output.new_zeros(ctx.shape).index_copy(ctx.dim, block, grad_output * ctx.scale)
        return grad, None, None, None, None, None


def _index_in_group(groups) -> int:
    """This replica's position in its replica group (its ordinal without groups)."""
    me = xr.global_ordinal()
    for group in groups or ():
        if me in group:
            return list(group).index(me)
    return me


def reduce_scatter(reduce_type, value, scale: float, scatter_dim: int, shard_count: int, groups=None):
    """``xm.reduce_scatter`` (one tensor, ``REDUCE_SUM``) that autograd differentiates. A lazyxla addition:
    torch_xla's ``functions`` module has no reduce_scatter.

    Example::

        shard = xf.reduce_scatter(xm.REDUCE_SUM, x, 1.0, 0, xr.world_size())
    """
    return ReduceScatter.apply(value, reduce_type, scale, scatter_dim, shard_count, groups)


def distributed_mm(w: torch.Tensor, x: torch.Tensor, split: int = 1) -> torch.Tensor:
    """``weight @ x`` for a weight ``N x (Ko * world)`` sharded by columns: each replica holds its block ``w``
    (``N x Ko``, block ``ordinal``) and its own ``x`` (``Ko * world x M``), and gets ``weight @ x`` (``N x M``).
    ``split`` > 1 processes ``x``'s columns in that many chunks (smaller gathers).

    Example::

        y = xf.distributed_mm(w_shard, x)
    """
    ordinal, world = xr.global_ordinal(), xr.world_size()
    if x.size(0) // world != w.size(1):
        raise ValueError(f"distributed_mm: x has {x.size(0)} rows; expected {w.size(1)} per replica x {world}")
    if x.size(1) % split:
        raise ValueError(f"distributed_mm: {x.size(1)} columns do not split into {split} equal chunks")
    results = []
    rows = _block(w.size(1), ordinal, w.device)  # the rows of x this replica's w multiplies
    for xs in torch.split(x, x.size(1) // split, dim=1):
        gathered = all_gather(xs, dim=1)  # (Ko * world) x (m * world): every replica's chunk
        partial = all_reduce(xm.REDUCE_SUM, w @ gathered.index_select(0, rows))  # summed over the row blocks
        results.append(partial.index_select(1, _block(xs.size(1), ordinal, w.device)))  # this replica's chunk
    return torch.cat(results, dim=1) if len(results) > 1 else results[0]


class AllReduceSumLayer(torch.autograd.Function):
    """A SUM all-reduce whose backward all-reduces the gradient too (the gradient of the sum of every
    replica's loss).

    Example::

        global_mean = xf.AllReduceSumLayer.apply(local_mean) / xr.world_size()
    """

    @staticmethod
    def forward(ctx, x):
        return xm.all_reduce(xm.REDUCE_SUM, x)

    @staticmethod
    def backward(ctx, grad_output):
        return xm.all_reduce(xm.REDUCE_SUM, grad_output)


class SyncBatchNorm(torch.nn.Module):
    """Batch normalization over the whole global batch: the batch statistics are averaged over the replicas
    (through :class:`AllReduceSumLayer`) in training; the running statistics are used in eval.

    Example::

        bn = xf.SyncBatchNorm(64).to(dev)
        y = bn(x)            # x: (N, 64, ...) on each replica
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = torch.nn.Parameter(torch.ones(num_features))
        self.bias = torch.nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        if not (2 <= batch.ndim <= 5 and batch.shape[1] == self.num_features):
            raise ValueError(
                f"SyncBatchNorm({self.num_features}): expected (N, {self.num_features}, ...) with 2 to 5 "
                f"dimensions, got {tuple(batch.shape)}"
            )
        dims = [d for d in range(batch.ndim) if d != 1]
        if self.training:
            scale = 1.0 / xr.world_size()
            mean = AllReduceSumLayer.apply(batch.mean(dim=dims)) * scale
            var = AllReduceSumLayer.apply((batch * batch).mean(dim=dims)) * scale - mean.pow(2)
            with torch.no_grad():  # the running statistics are state, not part of this step's gradient
                self.running_mean = (1 - self.momentum) * self.running_mean + self.momentum * mean
                self.running_var = (1 - self.momentum) * self.running_var + self.momentum * var
        else:
            mean, var = self.running_mean, self.running_var
        shape = [1, self.num_features] + [1] * (batch.ndim - 2)
        normalized = (batch - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        return normalized * self.weight.view(shape) + self.bias.view(shape)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}"


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
