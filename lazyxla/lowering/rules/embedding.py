"""Rules for embeddings: ``embedding``, embedding bags (sum, mean, max) and ``embedding_renorm``, with gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from lazyxla.lowering.registry import lowers
from lazyxla.lowering.rules.common import acc, vector_norm

aten = torch.ops.aten


# ---- embedding ----


@lowers(aten.embedding.default)
def _embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@lowers(aten.embedding_dense_backward.default)
def _embedding_dense_backward(ctx, grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    idx = indices.reshape(-1)
    g = grad.reshape(idx.shape[0], -1)
    if padding_idx >= 0:
        g = jnp.where((idx == padding_idx)[:, None], 0, g)
    if scale_grad_by_freq:
        counts = jnp.zeros(num_weights, g.dtype).at[idx].add(1)
        g = g / counts[idx][:, None]
    return jnp.zeros((num_weights, g.shape[1]), g.dtype).at[idx].add(g)


# ---- embedding bags (modes: 0 sum, 1 mean, 2 max) ----


def _bag_terms(indices, offsets, n_bags: int, padding_idx: int):
    """Each index's bag (offset2bag) and whether it counts (not padding_idx)."""
    # with include_last_offset the final offset only closes the last bag: entries past it join that bag
    bag = jnp.searchsorted(offsets[:n_bags], jnp.arange(indices.shape[0], dtype=offsets.dtype), side="right") - 1
    keep = (indices != padding_idx) & (bag >= 0)
    return bag, keep


def _bag_max(rows, keep, bag, indices, n_bags, bag_size):
    """Per bag and column: the maximum and the weight row it came from (the first on ties); 0 for empty bags."""
    rows = jnp.where(keep[:, None], rows, -jnp.inf)
    best = jax.ops.segment_max(rows, bag, n_bags)
    n = indices.shape[0]
    is_best = keep[:, None] & (rows == best[jnp.clip(bag, 0)])
    first = jax.ops.segment_min(jnp.where(is_best, jnp.arange(n)[:, None], n), bag, n_bags)
    empty = (bag_size == 0)[:, None]
    arg = indices[jnp.clip(first, 0, n - 1)] if n else jnp.zeros(first.shape, indices.dtype)
    return jnp.where(empty, 0, best), jnp.where(empty, 0, arg)


@lowers(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def _embedding_bag(
    ctx, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False, per_sample_weights=None,
    include_last_offset=False, padding_idx=-1,
):  # fmt: skip
    n_bags = ctx.shape[0]
    bag, keep = _bag_terms(indices, offsets, n_bags, padding_idx)
    rows = acc(weight)[indices]
    if per_sample_weights is not None:
        rows = rows * acc(per_sample_weights)[:, None]
    bag_size = jax.ops.segment_sum(keep.astype(jnp.int64), bag, n_bags)
    max_indices = jnp.zeros(ctx.avals[3].shape, jnp.int64)
    if mode == 2:
        out, max_indices = _bag_max(rows, keep, bag, indices, n_bags, bag_size)
    else:
        out = jax.ops.segment_sum(jnp.where(keep[:, None], rows, 0), bag, n_bags)
        out = out / jnp.maximum(bag_size, 1)[:, None].astype(out.dtype) if mode == 1 else out
    # the meta kernel sizes bag_size by the offsets (one more with include_last_offset): pad to it
    bag_size = jnp.zeros(ctx.avals[2].shape, bag_size.dtype).at[:n_bags].set(bag_size)
    return out, bag, bag_size, max_indices


def _embedding_bag_grad(g, indices, offset2bag, bag_size, max_indices, num_weights, scale_grad_by_freq, mode, psw, pad):
    g = acc(g)
    if mode == 2:
        cols = jnp.broadcast_to(jnp.arange(g.shape[1]), g.shape)
        live = (bag_size[: g.shape[0]] > 0)[:, None]
        return jnp.zeros((num_weights, g.shape[1]), g.dtype).at[max_indices, cols].add(jnp.where(live, g, 0))
    keep = (indices != pad) & (offset2bag >= 0)
    scale = keep.astype(g.dtype)
    if mode == 1:
        scale = scale / jnp.maximum(bag_size[offset2bag], 1)
    if psw is not None:
        scale = scale * acc(psw)
    if scale_grad_by_freq:
        scale = scale / jnp.zeros(num_weights, g.dtype).at[indices].add(1)[indices]
    return jnp.zeros((num_weights, g.shape[1]), g.dtype).at[indices].add(g[offset2bag] * scale[:, None])


@lowers(aten._embedding_bag_backward.default)
def _embedding_bag_backward(
    ctx, g, indices, offsets, offset2bag, bag_size, max_indices, num_weights, scale_grad_by_freq, mode, sparse,
    per_sample_weights, padding_idx=-1,
):  # fmt: skip
    # sparse=True gets the dense gradient: lazyxla has no sparse tensors
    args = (num_weights, scale_grad_by_freq, mode, per_sample_weights, padding_idx)
    return _embedding_bag_grad(g, indices, offset2bag, bag_size, max_indices, *args)


@lowers(aten._embedding_bag_dense_backward.default)
def _embedding_bag_dense_backward(
    ctx, g, indices, offset2bag, bag_size, max_indices, num_weights, scale_grad_by_freq, mode, per_sample_weights,
    padding_idx=-1,
):  # fmt: skip
    args = (num_weights, scale_grad_by_freq, mode, per_sample_weights, padding_idx)
    return _embedding_bag_grad(g, indices, offset2bag, bag_size, max_indices, *args)


@lowers(aten._embedding_bag_per_sample_weights_backward.default)
def _embedding_bag_per_sample_weights_backward(ctx, g, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    keep = (indices != padding_idx) & (offset2bag >= 0)
    grads = (acc(g)[offset2bag] * acc(weight)[indices]).sum(1)
    return jnp.where(keep, grads, 0)


@lowers(aten.embedding_renorm.default)
def _embedding_renorm(ctx, weight, indices, max_norm, norm_type):
    # the rows that ``indices`` names and whose norm exceeds max_norm are scaled down to it
    # rounded as PyTorch's kernel rounds half-precision weights: the norm and the scale to the weight's dtype
    norms = vector_norm(jnp.abs(acc(weight)), -1, norm_type).astype(weight.dtype).astype(acc(weight).dtype)
    named = jnp.zeros(weight.shape[0], bool).at[indices].set(True)
    scale = jnp.where(named & (norms > max_norm), max_norm / (norms + 1e-7), 1)
    return weight * scale[:, None].astype(weight.dtype)
