"""Replica collectives -> XLA collectives over the replica mesh axis (``ctx.axis``, ``ctx.world`` replicas).

Outside a multi-replica program (one process: ``ctx.world == 1``) each collective is what it is over a
single replica: all_reduce scales, all_gather and the rest return their input.

Replica groups: XLA's grouped collectives are not expressible inside ``shard_map``, so a grouped
collective gathers every replica's value and picks its group's members with a static table (a
``world``-times larger transfer; the ungrouped forms map one-to-one onto XLA's collectives).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

try:
    from jax.experimental.shard_alike import shard_alike
except ImportError:  # jax 0.11 has none (a trial under LAZYXLA_ALLOW_UNSUPPORTED_VERSIONS; 0.10 is supported)
    shard_alike = None

from lazyxla.device import meshes
from lazyxla.lowering.registry import lowers
from lazyxla.ops import ReduceOp, ops


def _chunks(groups, size: int) -> list[list[int]]:
    return [list(groups[i : i + size]) for i in range(0, len(groups), size)]


def _tables(groups, size: int, world: int) -> tuple[np.ndarray, np.ndarray]:
    """For each replica: the members of its group (world x size) and its position in the group."""
    members = np.zeros((world, size), np.int32)
    position = np.zeros(world, np.int32)
    for group in _chunks(groups, size):
        for k, r in enumerate(group):
            members[r] = group
            position[r] = k
    return members, position


def _me(ctx):
    return lax.axis_index(ctx.axis)


def _position(ctx, groups, size):
    if not groups:
        return _me(ctx)
    return jnp.asarray(_tables(groups, size, ctx.world)[1])[_me(ctx)]


def _group_values(ctx, x, groups, size):
    """Every member's ``x`` stacked on a new leading axis (all replicas when ``groups`` is empty)."""
    everyone = lax.all_gather(x, ctx.axis)
    if not groups:
        return everyone
    members = jnp.asarray(_tables(groups, size, ctx.world)[0])[_me(ctx)]
    return jnp.take(everyone, members, axis=0)


def _bits(x):  # collectives of booleans run on uint8
    return x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x


def _reduce_stacked(op: ReduceOp, v, dtype):
    if op == ReduceOp.SUM:
        out = v.sum(0, dtype=v.dtype) if dtype != jnp.bool_ else v.any(0)
    elif op == ReduceOp.MUL:
        out = v.prod(0, dtype=v.dtype) if dtype != jnp.bool_ else v.all(0)
    elif op == ReduceOp.MIN:
        out = v.min(0)
    elif op == ReduceOp.MAX:
        out = v.max(0)
    elif op in (ReduceOp.AND, ReduceOp.OR):
        if dtype == jnp.bool_:
            out = v.all(0) if op == ReduceOp.AND else v.any(0)
        else:
            combine = lax.bitwise_and if op == ReduceOp.AND else lax.bitwise_or
            out = v[0]
            for i in range(1, v.shape[0]):
                out = combine(out, v[i])
    else:  # pragma: no cover - ReduceOp is validated at the call
        raise ValueError(f"unknown reduce op {op}")
    return out.astype(dtype)


_DIRECT = {ReduceOp.SUM: lax.psum, ReduceOp.MIN: lax.pmin, ReduceOp.MAX: lax.pmax}


def _all_reduce(ctx, x, op, groups, size):
    op = ReduceOp(op)
    if ctx.world == 1 or (groups and size == 1):
        return x
    if not groups and op in _DIRECT and x.dtype != jnp.bool_:
        return _DIRECT[op](x, ctx.axis)
    if not groups and x.dtype == jnp.bool_ and op in (ReduceOp.AND, ReduceOp.OR, ReduceOp.MIN, ReduceOp.MAX):
        f = lax.pmin if op in (ReduceOp.AND, ReduceOp.MIN) else lax.pmax
        return f(_bits(x), ctx.axis).astype(jnp.bool_)
    return _reduce_stacked(op, _group_values(ctx, x, groups, size), x.dtype)


def _scaled(x, scale: float):
    return x if scale == 1.0 else (x * scale).astype(x.dtype)


@lowers(ops.all_reduce.default)
def _all_reduce_rule(ctx, x, op, scale, groups, group_size):
    return _scaled(_all_reduce(ctx, x, op, groups, group_size), scale)


@lowers(ops.all_reduce_coalesced.default)
def _all_reduce_coalesced(ctx, xs, op, scale, groups, group_size):
    if ctx.world > 1 and not groups and ReduceOp(op) == ReduceOp.SUM and all(x.dtype != jnp.bool_ for x in xs):
        return [_scaled(x, scale) for x in lax.psum(tuple(xs), ctx.axis)]  # one all-reduce for the list
    return [_scaled(_all_reduce(ctx, x, op, groups, group_size), scale) for x in xs]


def _all_gather(ctx, x, dim, groups, size):
    if ctx.world == 1 or (groups and size == 1):
        return x
    if not groups:
        return lax.all_gather(x, ctx.axis, axis=dim, tiled=True)
    v = jnp.moveaxis(_group_values(ctx, x, groups, size), 0, dim)  # (..., members, x.shape[dim], ...)
    return v.reshape(x.shape[:dim] + (-1,) + x.shape[dim + 1 :])


@lowers(ops.all_gather.default)
def _all_gather_rule(ctx, x, dim, groups, group_size):
    return _all_gather(ctx, x, dim, groups, group_size)


@lowers(ops.all_gather_coalesced.default)
def _all_gather_coalesced(ctx, xs, dim, groups, group_size):
    return [_all_gather(ctx, x, dim, groups, group_size) for x in xs]


def _reduce_scatter(ctx, x, op, scale, dim, count, groups, size):
    if count == 1:
        return _scaled(_all_reduce(ctx, x, op, groups, size), scale)
    if not groups and ReduceOp(op) == ReduceOp.SUM and x.dtype != jnp.bool_:
        return _scaled(lax.psum_scatter(x, ctx.axis, scatter_dimension=dim, tiled=True), scale)
    full = _all_reduce(ctx, x, op, groups, size)
    chunk = x.shape[dim] // count
    return _scaled(lax.dynamic_slice_in_dim(full, _position(ctx, groups, size) * chunk, chunk, dim), scale)


@lowers(ops.reduce_scatter.default)
def _reduce_scatter_rule(ctx, x, op, scale, dim, count, groups, group_size):
    return _reduce_scatter(ctx, x, op, scale, dim, count, groups, group_size)


@lowers(ops.reduce_scatter_coalesced.default)
def _reduce_scatter_coalesced(ctx, xs, op, scale, dim, count, groups, group_size):
    return [_reduce_scatter(ctx, x, op, scale, dim, count, groups, group_size) for x in xs]


@lowers(ops.all_to_all.default)
def _all_to_all(ctx, x, split_dim, concat_dim, count, groups, group_size):
    if count == 1:
        return x
    if not groups:
        return lax.all_to_all(x, ctx.axis, split_dim, concat_dim, tiled=True)
    chunk = x.shape[split_dim] // count
    v = _group_values(ctx, x, groups, group_size)  # (members, ...x.shape)
    mine = lax.dynamic_slice_in_dim(v, _position(ctx, groups, group_size) * chunk, chunk, split_dim + 1)
    mine = jnp.moveaxis(mine, 0, concat_dim)  # each member's piece for me, in member order, along concat_dim
    shape = list(x.shape)
    shape[split_dim] = chunk
    shape[concat_dim] *= count
    return mine.reshape(shape)


@lowers(ops.collective_permute.default)
def _collective_permute(ctx, x, pairs):
    perm = [(pairs[i], pairs[i + 1]) for i in range(0, len(pairs), 2)]
    if ctx.world == 1:
        return x if (0, 0) in perm else jnp.zeros_like(x)
    return lax.ppermute(x, ctx.axis, perm)


def _broadcast(ctx, x, root):
    if ctx.world == 1:
        return x
    v = _bits(x)
    out = lax.psum(jnp.where(_me(ctx) == root, v, jnp.zeros_like(v)), ctx.axis)
    return out.astype(x.dtype)


@lowers(ops.broadcast.default)
def _broadcast_rule(ctx, x, root):
    return _broadcast(ctx, x, root)


@lowers(ops.broadcast_coalesced.default)
def _broadcast_coalesced(ctx, xs, root):
    return [_broadcast(ctx, x, root) for x in xs]


@lowers(ops.shard.default)
def _shard(ctx, x, mesh, spec):
    """A sharding annotation (lazyxla.spmd.mark_sharding on a pending value): a constraint for XLA."""
    layout = meshes.named_sharding(mesh, spec)
    return jax.lax.with_sharding_constraint(x, layout)


@lowers(ops.shard_like.default)
def _shard_like(ctx, x, like):
    """``x`` in the layout of ``like`` (both are constrained to one layout, which XLA's propagation picks)."""
    if shard_alike is None:
        raise NotImplementedError(
            f"shard_like needs jax.experimental.shard_alike, which jax {jax.__version__} lacks: use jax 0.10"
        )
    return shard_alike(x, like)[0]
