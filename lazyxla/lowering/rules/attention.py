"""Rules for fused scaled dot-product attention.

lazyxla's kernel for ``F.scaled_dot_product_attention`` (in ``frontend/kernels.py``) calls PyTorch's "overrideable"
fused attention op when there is no dropout and no grouped-query broadcast, so attention arrives here as
one op (and its backward as one op) instead of PyTorch's ~20-op math decomposition.

``config.sdpa_implementation`` picks the implementation (``choose``): on a CUDA GPU, where jax offers it for
the call, cuDNN flash attention through ``jax.nn.dot_product_attention(implementation="cudnn")``; otherwise
XLA, by lazyxla's own formulation (``_attention``: faster on the CPU than jax.nn's "xla" implementation, see
``sdpa_xla``). Each runs as a named function, so the program dump shows ``call @sdpa_xla`` or
``call @sdpa_cudnn``. XLA's computes half-precision inputs in float32, as PyTorch's CPU kernel accumulates;
cuDNN's takes them as they are (it accumulates in float32 and rounds the probabilities to the input dtype
before their product with v). Backward: XLA's is flash attention's backward from the forward's log-sum-exp
(``_attention_grads``, half the StableHLO of a vjp of the forward); cuDNN's is ``jax.vjp`` of the cuDNN
forward, which runs cuDNN's fused backward after recomputing the forward (the op split hands the backward
only PyTorch's outputs, not jax's residuals): one more fused forward per attention in a training step.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from lazyxla.config import config
from lazyxla.device import devices
from lazyxla.device.devices import np_dtype
from lazyxla.lowering.registry import lowers
from lazyxla.lowering.rules.common import acc

aten = torch.ops.aten

_HALF = ("float16", "bfloat16")


def _cuda_capability() -> tuple[int, ...] | None:
    """The CUDA compute capability of the lazyxla device, None off CUDA (a CPU, a TPU, a ROCm GPU: jax's
    cuDNN attention is CUDA's only)."""
    device = devices.local_devices()[0]
    cc = getattr(device, "compute_capability", None) if device.platform == "gpu" else None
    return tuple(int(x) for x in cc.split(".")) if cc else None


def cudnn_refusal(q_shape, k_shape, v_shape, dtype: str, bias: bool) -> str | None:
    """Why jax's cuDNN flash attention (jax 0.10's ``check_layout`` and ``check_is_flash_attention``) cannot
    take an attention call with these PyTorch-layout shapes (batch, heads, length, head dim), dtype name and
    mask; None when it can.

    Example::

        cudnn_refusal((2, 8, 128, 64), (2, 8, 128, 64), (2, 8, 128, 64), "bfloat16", False)   # None on a GPU
    """
    cc = _cuda_capability()
    if cc is None:
        return f"the lazyxla device is a {devices.platform()!r} device, and cuDNN attention runs on CUDA GPUs only"
    if dtype not in _HALF:
        return f"the inputs are {dtype}, and cuDNN flash attention takes float16 or bfloat16 only"
    head, value_head = q_shape[-1], v_shape[-1]
    if head != value_head:
        return f"the query head dim {head} differs from the value head dim {value_head}"
    limit = 256 if cc >= (9, 0) else 128
    if head > limit or head % 8:
        return f"the head dim is {head}, and cuDNN takes a multiple of 8 up to {limit} on this GPU"
    if bias and (q_shape[-2] % 2 or k_shape[-2] % 2):
        return f"with a mask or bias cuDNN needs even sequence lengths, and these are {q_shape[-2]} and {k_shape[-2]}"
    return None


def choose(q_shape, k_shape, v_shape, dtype: str, bias: bool) -> str:
    """``'xla'`` or ``'cudnn'``: the implementation ``config.sdpa_implementation`` gives an attention call.

    Raises ValueError for 'cudnn' on a call cuDNN cannot take, naming why.

    Example::

        choose(q.shape, k.shape, v.shape, "float32", False)    # 'xla' on a CPU
    """
    wanted = config.sdpa_implementation
    if wanted == "xla":
        return "xla"
    if wanted == "auto" and devices.spmd_enabled():
        # jax's cuDNN attention refuses a sequence dim laid out over devices (context parallelism) and its
        # layout rules under a mesh are untested here: 'auto' keeps SPMD programs on XLA ('cudnn' forces it)
        return "xla"
    why = cudnn_refusal(q_shape, k_shape, v_shape, dtype, bias)
    if why is None:
        return "cudnn"
    if wanted == "cudnn":
        raise ValueError(
            f"lazyxla.config.sdpa_implementation is 'cudnn' (LAZYXLA_SDPA_IMPLEMENTATION), but {why}; "
            "set it to 'auto' (cuDNN where it can, XLA elsewhere) or 'xla'"
        )
    return "xla"


def _scores(q, k, bias, is_causal, scale):
    """``q k^T * scale``, -inf above the diagonal when ``is_causal``, plus ``bias``: the attention logits."""
    s = jnp.einsum("...qd,...kd->...qk", q, k) * jnp.asarray(scale, q.dtype)
    if is_causal:
        rows, cols = (lax.broadcasted_iota(jnp.int32, s.shape[-2:], d) for d in (0, 1))
        s = lax.select(jnp.broadcast_to(rows >= cols, s.shape), s, jnp.full(s.shape, -jnp.inf, s.dtype))
    if bias is not None:
        s = s + acc(bias).astype(s.dtype)
    return s


def _scale(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def _rows(x, shape):
    """Per-row values ``x`` (the logits' shape without its last dimension) broadcast along the rows."""
    return lax.broadcast_in_dim(x, shape, tuple(range(x.ndim)))


def _attention(q, k, v, bias, is_causal, scale):
    """Softmax(q k^T * scale + mask) v and the row log-sum-exp, in q's accumulate type, normalized after the
    product as flash attention does.

    A query that may attend to nothing (its row is all -inf: a padding position under a padding mask) gets
    zeros, log-sum-exp -inf and a zero gradient, as PyTorch's kernels and its math path (``_safe_softmax``) give,
    not NaN: its row maximum is taken as the lowest finite number, so that its exponentials are 0, and its sum
    of them as 1.
    """
    q, k, v = acc(q), acc(k), acc(v)
    s = _scores(q, k, bias, is_causal, _scale(q, scale))
    m = jnp.maximum(s.max(-1, initial=None if s.shape[-1] else -jnp.inf), jnp.finfo(s.dtype).min)  # (no keys: -inf)
    e = jnp.exp(s - _rows(m, s.shape))
    total = e.sum(-1)
    out = jnp.einsum("...qk,...kd->...qd", e, v)
    return out / _rows(jnp.maximum(total, 1), out.shape), m + jnp.log(total)


def _sum_to(x, shape):
    """``x`` summed over the dimensions a tensor of ``shape`` was broadcast along to ``x``'s shape."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and x.shape[lead + i] != 1)
    return x.sum(axes, keepdims=True).reshape(shape) if axes else x


def _attention_grads(g, q, k, v, bias, out, lse, is_causal, scale):
    """Gradients of the attention output for its cotangent ``g`` (q, k, v, bias), from the forward's output and
    row log-sum-exp (a row that attends to nothing has -inf there, and gets zero gradients), as flash
    attention's backward computes them: ``p = exp(s - lse)`` again, then ``ds = p * (g v^T - rowsum(g * out))``.
    No second softmax (the vjp of the forward had its max, sums, selects and their
    transposes: 62 StableHLO lines per call in the GPT benchmark against 30 here)."""
    q, k, v, g, out = acc(q), acc(k), acc(v), acc(g), acc(out)
    scale = _scale(q, scale)
    s = _scores(q, k, bias, is_causal, scale)
    # a row that attends to nothing has lse -inf: +inf there makes every exp(s - lse) 0 (s is finite or -inf)
    lse = jnp.where(lse == -jnp.inf, jnp.inf, lse.astype(s.dtype))
    p = jnp.exp(s - _rows(lse, s.shape))
    dv = jnp.einsum("...qk,...qd->...kd", p, g)
    dp = jnp.einsum("...qd,...kd->...qk", g, v)
    ds = p * (dp - _rows(jnp.sum(g * out, axis=-1), dp.shape))
    dq = jnp.einsum("...qk,...kd->...qd", ds, k) * jnp.asarray(scale, q.dtype)
    dk = jnp.einsum("...qk,...qd->...kd", ds, q) * jnp.asarray(scale, q.dtype)
    return dq, dk, dv, None if bias is None else _sum_to(ds, bias.shape)


# a program function of its own per implementation, named as the function is: the StableHLO says which ran
_named = functools.partial(jax.jit, static_argnames=("is_causal", "scale"))


def _btnh(x):
    """PyTorch's (batch, heads, length, dim) as jax's (batch, length, heads, dim), and back."""
    return jnp.swapaxes(x, 1, 2)


@_named
def sdpa_xla(q, k, v, bias, *, is_causal, scale):
    """Attention output and row log-sum-exp (PyTorch's layouts, float32) by XLA: lazyxla's own formulation
    (``_attention``), not ``jax.nn.dot_product_attention(implementation="xla")``, which ran a warm CPU forward
    ~35% slower (it normalizes the probabilities before their product with v, and computes the log-sum-exp
    in a second pass), gives NaN for a row a -inf bias masks whole, and needs equal query and value head dims."""
    return _attention(q, k, v, bias, is_causal, scale)


# the finite stand-in for -inf in a bias given to cuDNN: jax's own for its masks (cuDNN mishandles the
# difference of two very large negative numbers), per dtype
_CUDNN_NEGATIVE = {"bfloat16": -(2 << 40), "float16": -(2 << 14)}


def _sdpa_cudnn(q, k, v, bias, is_causal, scale):
    """``sdpa_cudnn``'s output and log-sum-exp (as cuDNN rounds it: to the inputs' dtype)."""
    keep = None
    if bias is not None:
        bias = jnp.broadcast_to(bias, (*((1,) * (4 - bias.ndim)), *bias.shape[:-2], q.shape[-2], k.shape[-2]))
        keep = jnp.any(bias > -jnp.inf, axis=-1)  # rows with a key to attend to
        bias = jnp.maximum(bias.astype(q.dtype), jnp.asarray(_CUDNN_NEGATIVE[str(q.dtype)], q.dtype))
    out, lse = jax.nn.dot_product_attention(
        _btnh(q), _btnh(k), _btnh(v), bias, scale=scale, is_causal=is_causal, implementation="cudnn",
        return_residual=True,
    )  # fmt: skip
    out, lse = _btnh(out), jnp.swapaxes(lse, 1, 2).astype(jnp.float32)
    if keep is not None:  # a row masked whole: zeros and -inf, as PyTorch gives (cuDNN averages v there)
        keep = jnp.broadcast_to(keep, lse.shape)
        out = jnp.where(_rows(keep, out.shape), out, jnp.zeros((), out.dtype))
        lse = jnp.where(keep, lse, -jnp.inf)
    return out, lse


@_named
def sdpa_cudnn(q, k, v, bias, *, is_causal, scale):
    """Attention output and row log-sum-exp by jax's cuDNN flash attention (inputs in their own half dtype).
    A -inf in the bias becomes jax's large finite negative for cuDNN; rows masked whole give zeros."""
    return _sdpa_cudnn(q, k, v, bias, is_causal, scale)


@_named
def sdpa_cudnn_backward(g, q, k, v, bias, *, is_causal, scale):
    """Gradients for q, k, v and the bias by ``jax.vjp`` of ``sdpa_cudnn``: cuDNN's fused backward, after a
    recomputed forward (jax's residuals do not cross from the forward op to the backward op)."""
    out, pull = jax.vjp(lambda q, k, v, b: _sdpa_cudnn(q, k, v, b, is_causal, scale)[0], q, k, v, bias)
    return pull(g.astype(out.dtype))


@_named
def sdpa_xla_backward(g, q, k, v, bias, out, lse, *, is_causal, scale):
    """``_attention_grads`` as a named function of the program (the dump's ``call @sdpa_xla_backward``)."""
    return _attention_grads(g, q, k, v, bias, out, lse, is_causal, scale)


def _implementation(q, k, v, bias) -> str:
    return choose(q.shape, k.shape, v.shape, str(q.dtype), bias is not None)


@lowers(aten._scaled_dot_product_fused_attention_overrideable.default)
def _sdpa(ctx, q, k, v, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    if dropout_p:
        raise NotImplementedError("fused attention with dropout: lazyxla routes it to the math path")
    run = sdpa_cudnn if _implementation(q, k, v, attn_bias) == "cudnn" else sdpa_xla
    out, lse = run(q, k, v, attn_bias, is_causal=bool(is_causal), scale=float(_scale(q, scale)))
    # the rest (PyTorch's dropout seed and offset) are placeholders: dropout takes the math path
    return (out, lse, *(jnp.zeros(a.shape, np_dtype(a.dtype)) for a in ctx.avals[2:]))


@lowers(aten._scaled_dot_product_fused_attention_overrideable_backward.default)
def _sdpa_backward(
    ctx, g, q, k, v, attn_bias, grad_input_mask, out, lse, cum_q, cum_k, max_q, max_k, dropout_p, is_causal,
    philox_seed, philox_offset, *, scale=None,
):  # fmt: skip
    bias = attn_bias if attn_bias is not None and attn_bias.size else None
    statics = dict(is_causal=bool(is_causal), scale=float(_scale(q, scale)))
    if _implementation(q, k, v, bias) == "cudnn":
        grads = sdpa_cudnn_backward(g, q, k, v, bias, **statics)
    else:
        grads = sdpa_xla_backward(g, q, k, v, bias, out, lse, **statics)
    mask = (*grad_input_mask[:3], grad_input_mask[3] and bias is not None)
    return tuple(
        grad if grad is not None and wanted else jnp.zeros(aval.shape, np_dtype(aval.dtype))
        for grad, wanted, aval in zip(grads, mask, ctx.avals)
    )
