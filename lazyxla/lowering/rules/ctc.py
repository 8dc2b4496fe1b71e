"""Rules for the CTC loss (``F.ctc_loss``: ``aten._ctc_loss`` and its backward, lengths as int lists or tensors).

The forward is PyTorch's alpha recursion (ATen/native/LossCTC.cpp) in log space, one ``lax.scan`` step per input
frame over the extended target ``blank, t1, blank, t2, ..., blank`` of every sequence; each sequence's recursion
stops at its input length and its loss is read at its own target length. Lengths given as tensors stay tensors:
the program does not change with the batch's lengths (``targets``, padded 2-d or concatenated 1-d, is read per
sequence at positions computed in the program).

``log_alpha``, the op's second output, is (batch, frames, 2 * max target length + 1). With int-list lengths the
maximum is known and the shape is PyTorch's; with tensor lengths it is bounded by the targets' shape instead
(their width, or their total length when concatenated), which only the backward op reads. Entries past a
sequence's lengths, which PyTorch leaves uninitialized, are -inf here.

The backward is PyTorch's formula: ``(exp(lp) - exp(log(sum alpha * beta over the positions of c) + nll - lp)) *
grad`` over the frames of each sequence, 0 past them; for a sequence whose loss is infinite, 0 with
``zero_infinity``, else NaN on its frames (PyTorch's ``inf - inf``). The second term is the derivative of the loss
by the log-probabilities, taken here by ``jax.vjp`` through the recursion; the first is the term PyTorch adds (it
assumes ``log_probs`` come from ``log_softmax``, whose backward then removes it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from lazyxla.lowering.registry import lowers

aten = torch.ops.aten


def _padded_targets(targets, target_lengths, width: int):
    """(batch, width) targets: a padded 2-d ``targets`` as it is, a concatenated 1-d one cut per sequence."""
    if targets.ndim == 2:
        return targets[:, :width]
    starts = jnp.cumsum(target_lengths) - target_lengths
    at = jnp.clip(starts[:, None] + jnp.arange(width)[None, :], 0, max(targets.shape[0] - 1, 0))
    return targets[at] if targets.shape[0] else jnp.zeros(at.shape, targets.dtype)


def _logsumexp3(a, b, c):
    """log(e^a + e^b + e^c), -inf (with zero gradients, not NaN) where all three are -inf."""
    m = jnp.maximum(jnp.maximum(a, b), c)
    finite = jnp.isfinite(m)
    m = jnp.where(finite, m, 0)
    total = jnp.exp(a - m) + jnp.exp(b - m) + jnp.exp(c - m)
    ok = finite & (total > 0)
    return jnp.where(ok, jnp.log(jnp.where(ok, total, 1)) + m, -jnp.inf)


def _alphas(log_probs, targets, input_lengths, target_lengths, blank: int, width: int):
    """The negative log likelihood of each sequence and every alpha: (batch,), (batch, frames, 2 * width + 1)."""
    frames, batch, _ = log_probs.shape
    n_ext = 2 * width + 1
    il = input_lengths.astype(jnp.int32)
    tl = target_lengths.astype(jnp.int32)
    labels = _padded_targets(targets, tl, width).astype(jnp.int32)
    ext = jnp.full((batch, n_ext), blank, jnp.int32).at[:, 1::2].set(labels)  # blank, t1, blank, t2, ..., blank
    s = jnp.arange(n_ext)
    inside = s[None, :] < 2 * tl[:, None] + 1
    # a label may be reached from two positions back, skipping the blank between, unless it repeats that label
    before = jnp.concatenate([jnp.full((batch, 2), -1, jnp.int32), ext[:, :-2]], axis=1)
    skip = (ext != blank) & (ext != before)
    neg = jnp.full((batch, 1), -jnp.inf, log_probs.dtype)

    def emit(lp_t):  # (batch, n_ext): the log probability of each extended label at one frame
        return jnp.take_along_axis(lp_t, ext, axis=1)

    start = jnp.where((s[None, :] < 2) & inside, emit(log_probs[0]), -jnp.inf)
    start = jnp.where(il[:, None] > 0, start, -jnp.inf)

    def step(prev, xs):
        t, lp_t = xs
        one = jnp.concatenate([neg, prev[:, :-1]], axis=1)
        two = jnp.where(skip, jnp.concatenate([neg, neg, prev[:, :-2]], axis=1), -jnp.inf)
        new = jnp.where(inside, _logsumexp3(prev, one, two) + emit(lp_t), -jnp.inf)
        live = (t < il)[:, None]
        return jnp.where(live, new, prev), jnp.where(live, new, -jnp.inf)

    last, rest = lax.scan(step, start, (jnp.arange(1, frames), log_probs[1:]))
    log_alpha = jnp.concatenate([start[:, None, :], jnp.moveaxis(rest, 0, 1)], axis=1)
    end = jnp.take_along_axis(last, (2 * tl)[:, None], axis=1)[:, 0]
    before_end = jnp.take_along_axis(last, jnp.maximum(2 * tl - 1, 0)[:, None], axis=1)[:, 0]
    before_end = jnp.where(tl > 0, before_end, -jnp.inf)
    nll = -_logsumexp3(end, before_end, jnp.full_like(end, -jnp.inf))
    return nll, log_alpha


def _width(targets, target_lengths, log_alpha_width: int | None = None) -> int:
    """The static bound of the target lengths: PyTorch's maximum for int lists, the targets' shape for tensors."""
    if isinstance(target_lengths, (list, tuple)):
        return max(target_lengths, default=0)
    if log_alpha_width is not None:
        return (log_alpha_width - 1) // 2
    return targets.shape[1] if targets.ndim == 2 else targets.shape[0]


def _lengths(x):
    return jnp.asarray(x, jnp.int32) if isinstance(x, (list, tuple)) else x


@lowers(aten._ctc_loss.default, aten._ctc_loss.Tensor)
def _ctc_loss(ctx, log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    width = _width(targets, target_lengths, ctx.avals[1].shape[2])
    return _alphas(log_probs, targets, _lengths(input_lengths), _lengths(target_lengths), blank, width)


@lowers(aten._ctc_loss_backward.default, aten._ctc_loss_backward.Tensor)
def _ctc_loss_backward(
    ctx, grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank, zero_infinity=False
):
    width = _width(targets, target_lengths, log_alpha.shape[2])
    il, tl = _lengths(input_lengths), _lengths(target_lengths)
    _, vjp = jax.vjp(lambda lp: _alphas(lp, targets, il, tl, blank, width)[0], log_probs)
    (dlp,) = vjp(grad.astype(log_probs.dtype))
    frames = log_probs.shape[0]
    live = (jnp.arange(frames)[:, None] < il[None, :])[:, :, None]  # (frames, batch, 1)
    out = jnp.where(live, jnp.exp(log_probs) * grad[None, :, None] + dlp, 0)
    # an infinite loss (no alignment fits the frames): PyTorch's formula gives inf - inf, NaN, on the live frames
    infinite = jnp.isinf(nll)[None, :, None]
    out = jnp.where(infinite, 0 if zero_infinity else jnp.where(live, jnp.nan, 0), out)
    return out.astype(log_probs.dtype)
