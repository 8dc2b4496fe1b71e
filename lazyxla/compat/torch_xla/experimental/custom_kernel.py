"""``torch_xla.experimental.custom_kernel`` on lazyxla: Pallas kernels and attention over :func:`lazyxla.call_jax`.

* ``make_kernel_from_pallas(kernel, output_shape_dtype_fn)``: a torch-callable running a JAX function that calls
  ``pl.pallas_call`` (torch_xla's TPU custom call) as one node of the step's program. On the CPU, where Pallas only
  interprets, the kernel runs under ``pltpu.force_tpu_interpret_mode()`` (jax's TPU interpreter: it emulates the
  TPU's memory spaces, so kernels written for torch_xla's TPUs run unchanged); on a GPU or TPU it is compiled. It is
  traced with 32-bit types (as jax runs on torch_xla's TPUs) unless an input is 64-bit, and its ``custom_vjp``
  backward in the same mode (``_kernel_call``, shared with flash attention's TPU path).
* ``flash_attention(q, k, v, causal, q_segment_ids, kv_segment_ids, sm_scale, ab=...)``: torch_xla's semantics
  (those of jax's TPU flash attention): ``logits = (q @ k^T + ab) * sm_scale``; a query attends to a key only where
  the segment ids are equal and, when causal, the key's index is at most the query's; masked logits get
  ``DEFAULT_MASK_VALUE`` added (so a row with no key left averages uniformly instead of giving NaN). On a TPU, when
  the lengths are multiples of 128 (the kernel's blocks) and SPMD is off, it is jax's Pallas TPU flash attention
  (``jax.experimental.pallas.ops.tpu.flash_attention``: O(len) memory, its own backward kernels), as in torch_xla;
  elsewhere, and for other shapes, an exact XLA formulation written in JAX (float32 logits and softmax),
  differentiated by ``jax.vjp``. XLA partitions that from the inputs' shardings, so ``partition_spec``/``mesh`` are
  accepted and not needed.
* ``quantized_matmul_int8(x, w, scalar, quantize_activation=...)``: torch_xla's w8a8 matmul (int8 weight ``[out,
  in]``, float scale per output channel; with ``quantize_activation`` the activations are quantized to int8 per row
  and the matmul runs int8 x int8 -> int32), an exact XLA formulation on every platform (the Pallas kernel is
  torch_xla's own, not jax's); the block sizes are accepted and not needed. ``zero_point``/``quant_block_size``
  raise, as torch_xla's kernel asserts. The blockwise and asymmetric forms are in ``xla_quantized_matmul``.
* ``gmm``, ``tgmm`` (grouped matmuls of mixture-of-experts layers) and ``GMM``: ``jax.lax.ragged_dot`` on every
  platform (exact; differentiable).
* ``paged_attention``, ``multi_queries_paged_attention``, ``ragged_paged_attention`` (vLLM's): torch_xla's
  semantics as exact XLA formulations in JAX on every platform (``_paged_attention``): lengths, page indices,
  ``cu_q_lens`` and ``num_seqs`` are program inputs (new values neither sync nor compile); padding rows are zeros;
  also ``torch.ops.xla.<name>``.

* ``torch.ops.xla.flash_attention``, ``gmm``, ``quantized_matmul_int8`` (and the paged kernels'): torch_xla's custom
  ops, registered when this module is imported (``_custom_ops.register``): the kernels above on lazyxla tensors,
  torch_xla's shapes elsewhere (fake and meta tensors).

``jax_import_guard()`` and ``@requires_jax`` exist and do nothing: lazyxla is built on jax, importing it is safe.

Example::

    from torch_xla.experimental.custom_kernel import flash_attention, make_kernel_from_pallas

    o = flash_attention(q, k, v, causal=True, sm_scale=q.shape[-1] ** -0.5)     # q, k, v: (batch, heads, len, dim)
    add = make_kernel_from_pallas(add_vectors, lambda x, y: [(x.shape, x.dtype)])
    z = add(x, y)                                                                # one node of the step's program
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import torch
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash

import lazyxla
from lazyxla.compat._common import missing_attribute, stub
from lazyxla.compat.torch_xla._internal.jax_workarounds import jax_import_guard, requires_jax  # noqa: F401 (as torch_xla)
from lazyxla.compat.torch_xla.experimental._custom_ops import register, warn_off_device
from lazyxla.compat.torch_xla.experimental._paged_attention import (  # noqa: F401 (torch_xla's names)
    multi_queries_paged_attention,
    multi_queries_paged_attention_non_xla,
    multi_queries_paged_attention_xla,
    non_xla_ragged_paged_attention,
    paged_attention,
    paged_attention_non_xla,
    paged_attention_xla,
    ragged_paged_attention,
    ragged_paged_attention_non_xla,
    ragged_paged_attention_xla,
)
from lazyxla.compat.torch_xla.experimental.xla_quantized_matmul import _check_per_channel, _xla_quantized_matmul
from lazyxla.device import devices

DEFAULT_MASK_VALUE = -0.7 * float(torch.finfo(torch.float32).max)  # torch_xla's and jax's flash attention's


def convert_torch_dtype_to_jax(dtype: torch.dtype) -> jnp.dtype:
    """The jax dtype of a torch dtype (float32 -> ``jnp.float32``, bfloat16 -> ``jnp.bfloat16``, ...).

    Example::

        convert_torch_dtype_to_jax(torch.bfloat16)       # dtype(bfloat16)
    """
    try:
        return jnp.dtype(devices.np_dtype(dtype))
    except (KeyError, TypeError):
        raise ValueError(f"Unsupported dtype: {dtype}") from None


def to_jax_shape_dtype_struct(tensor: torch.Tensor) -> jax.ShapeDtypeStruct:
    """``jax.ShapeDtypeStruct`` of a tensor's shape and dtype.

    Example::

        to_jax_shape_dtype_struct(torch.zeros(2, 3))      # ShapeDtypeStruct(shape=(2, 3), dtype=float32)
    """
    return jax.ShapeDtypeStruct(tuple(tensor.shape), convert_torch_dtype_to_jax(tensor.dtype))


# ---- make_kernel_from_pallas --------------------------------------------------------------------------------------


def make_kernel_from_pallas(kernel: Callable, output_shape_dtype_fn: Callable) -> Callable:
    """A function of lazyxla tensors running ``kernel`` (a JAX function calling ``pl.pallas_call``) through
    :func:`lazyxla.call_jax`: one node of the step's program.

    ``output_shape_dtype_fn(*args)`` returns a list of ``(shape, torch dtype)``, one per output, as torch_xla
    requires; lazyxla checks the kernel's outputs against it. The returned function takes the kernel's
    arguments (tensors, and hashable static values; ``static_argnums``/``static_argnames`` are accepted and not
    needed: every non-tensor is static) and returns one tensor, or a tuple for several outputs. Off a GPU or TPU the
    kernel runs in Pallas's TPU interpret mode; it is traced with 32-bit types unless an input is 64-bit (kernels
    written for TPUs mix int32 program ids with jax's default int). Pallas kernels have no reverse-mode rule: give
    ``kernel`` a ``jax.custom_vjp`` to differentiate through it (its backward's kernels run in the same mode).

    Example::

        def add_vectors_kernel(x_ref, y_ref, o_ref):
            o_ref[...] = x_ref[...] + y_ref[...]

        def add_vectors(x, y):
            return pl.pallas_call(add_vectors_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)

        add = make_kernel_from_pallas(add_vectors, lambda x, y: [(x.shape, x.dtype)])
        z = add(x, y)
    """
    runnable = _kernel_call(kernel, _COMPILES_ANY)

    @functools.wraps(kernel)
    def wrapped_kernel(*args, static_argnums=None, static_argnames=None, **kwargs):
        expected = output_shape_dtype_fn(*args)
        if not isinstance(expected, list):
            raise TypeError("make_kernel_from_pallas: output_shape_dtype_fn should return a list of (shape, dtype)")
        out = lazyxla.call_jax(runnable, *args, **kwargs)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        got = [(tuple(o.shape), o.dtype) for o in outs]
        want = [(tuple(s), d) for s, d in expected]
        if got != want:
            raise ValueError(
                f"make_kernel_from_pallas({getattr(kernel, '__name__', kernel)}): the kernel returned {got} but "
                f"output_shape_dtype_fn says {want}; make them agree"
            )
        return outs[0] if len(outs) == 1 else tuple(outs)

    return wrapped_kernel


# ---- running Pallas kernels: the one wrapper of make_kernel_from_pallas and flash attention's TPU path -------------

_COMPILES_ANY = ("gpu", "tpu", "cuda", "rocm")  # platforms Pallas compiles a user's kernel for (Triton or Mosaic)
_COMPILES_TPU = ("tpu",)  # where jax's TPU kernels (Mosaic) compile
_WIDE = frozenset(jnp.dtype(t) for t in ("float64", "int64", "uint64", "complex128"))


@functools.cache
def _kernel_call(fn: Callable, compiled_on: tuple[str, ...]) -> Callable:
    """``fn`` (a JAX function calling Pallas kernels, differentiable through its own ``custom_vjp``) as it runs on
    this platform: compiled where the platform is in ``compiled_on``, in Pallas's TPU interpreter elsewhere (Pallas
    compiles nothing for the CPU; the interpreter emulates the TPU's memory spaces, so kernels written for TPUs run
    unchanged), traced with 32-bit types unless an array argument is 64-bit (kernels mix int32 program ids with
    jax's default int, int64 under lazyxla's 64-bit mode: ``lax.select`` then refuses them; on a TPU jax runs
    32-bit). 64-bit arrays raise ``TypeError`` where the kernel is interpreted: jax's TPU interpreter does not take
    them (its tiling asserts an item size of 4 at most; its callbacks return 32-bit values). The mode covers the
    backward too: a ``custom_vjp``'s backward is traced when the VJP is taken, after the forward's trace has ended
    (``call_jax``'s backward node), so it is entered again there.

    Arguments are any pytree of arrays and static values (``flash_attention``'s ``None``s, a kernel's block sizes
    or flags given by keyword): the arrays are the differentiable inputs, the rest is passed through as it is. One
    object per ``(fn, compiled_on)``, so ``call_jax``'s plans and programs are reused.

    Example::

        run = _kernel_call(add_vectors, _COMPILES_ANY)
        lazyxla.call_jax(run, x, y)                   # on the CPU: the kernel in the TPU interpreter
    """

    @functools.wraps(fn)
    def call(*args, **kwargs):
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        where = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]
        arrays = [leaves[i] for i in where]
        wide = [jnp.dtype(a.dtype).name for a in arrays if jnp.dtype(a.dtype) in _WIDE]
        if wide and devices.platform() not in compiled_on:
            raise TypeError(
                f"{getattr(fn, '__name__', 'a Pallas kernel')}: Pallas's TPU interpreter, which runs kernels off a "
                f"GPU or TPU, takes no 64-bit arrays (TPUs have none), and got {', '.join(sorted(set(wide)))}: cast "
                "the tensors to 32 bits first (.float(), .int())"
            )

        def of_arrays(*xs):
            full = list(leaves)
            for i, x in zip(where, xs):
                full[i] = x
            a, kw = jax.tree_util.tree_unflatten(tree, full)
            return fn(*a, **kw)

        return _in_mode(of_arrays, functools.partial(_kernel_mode, compiled_on, bool(wide)))(*arrays)

    return call


def _in_mode(fn: Callable, mode: Callable) -> Callable:
    """``fn`` (arrays -> arrays) traced under the context ``mode()``: its primal, its forward and its backward."""

    @jax.custom_vjp
    def run(*arrays):
        with mode():
            return fn(*arrays)

    def forward(*arrays):
        with mode():
            return jax.vjp(fn, *arrays)  # its VJP function is a pytree of residual arrays

    def backward(vjp, cotangent):
        with mode():
            return vjp(cotangent)

    run.defvjp(forward, backward)
    return run


@contextlib.contextmanager
def _kernel_mode(compiled_on: tuple[str, ...], x64: bool) -> Iterator[None]:
    """jax's 64-bit mode as ``x64`` says; Pallas's TPU interpreter unless the platform is in ``compiled_on``."""
    with jax.enable_x64(x64):
        if devices.platform() in compiled_on:
            yield
        else:
            with pltpu.force_tpu_interpret_mode():
                yield


# ---- flash attention -----------------------------------------------------------------------------------------------


def flash_attention(
    q: torch.Tensor,  # [batch..., heads, q_len, dim]
    k: torch.Tensor,  # [batch..., heads, kv_len, dim]
    v: torch.Tensor,  # [batch..., heads, kv_len, dim]
    causal: bool = False,
    q_segment_ids: torch.Tensor | None = None,  # [batch..., q_len]
    kv_segment_ids: torch.Tensor | None = None,  # [batch..., kv_len]
    sm_scale: float = 1.0,
    *,
    ab: torch.Tensor | None = None,  # [batch..., heads, q_len, kv_len], added to q @ k^T before sm_scale
    partition_spec=None,
    mesh=None,
) -> torch.Tensor:
    """torch_xla's flash attention: ``softmax(mask((q @ k^T + ab) * sm_scale)) @ v``, differentiable in q, k, v, ab.

    Masks (torch_xla's): ``causal`` keeps key ``j <= i`` for query ``i`` (top-left aligned, as
    ``F.scaled_dot_product_attention(is_causal=True)``); segment ids keep keys whose id equals the query's. A masked
    logit gets ``DEFAULT_MASK_VALUE`` added. One ``call_jax`` node, its backward another: on a TPU (SPMD off, float32
    or bfloat16, lengths multiples of 128) jax's Pallas TPU flash attention and its backward kernels; otherwise
    computed exactly in float32 (XLA), the backward ``jax.vjp``'s. ``partition_spec``/``mesh`` are accepted: XLA
    partitions the computation from the inputs' shardings (mark q, k, v with ``xs.mark_sharding``).

    Example::

        o = flash_attention(q, k, v, causal=True)
        o = flash_attention(q, k, v, False, seg, seg, sm_scale=0.125, ab=bias)
    """
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("flash_attention: give both q_segment_ids and kv_segment_ids, or neither")
    if q.dim() < 3 or k.shape[:-2] != q.shape[:-2] or v.shape[:-1] != k.shape[:-1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"flash_attention: q, k, v must be [batch..., heads, len, dim] with matching batch, heads and dim "
            f"(k and v of one length); got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    fn = _pallas_attention if _tpu_kernels() and _fits_pallas_flash(q, k, v, ab) else _attention
    return lazyxla.call_jax(
        fn, q, k, v, ab, q_segment_ids, kv_segment_ids, causal=bool(causal), sm_scale=float(sm_scale)
    )


def _attention(q, k, v, ab, q_segment_ids, kv_segment_ids, *, causal: bool, sm_scale: float):
    """jax's ``mha_reference`` of its TPU flash attention, over any leading batch dimensions, in float32."""
    f32 = jnp.float32
    s = jnp.einsum("...qd,...kd->...qk", q, k, preferred_element_type=f32)
    if ab is not None:
        s = s + ab.astype(f32)
    if sm_scale != 1.0:
        s = s * sm_scale
    mask = None
    if q_segment_ids is not None:
        mask = q_segment_ids[..., None, :, None] == kv_segment_ids[..., None, None, :]
    if causal:
        shape = (q.shape[-2], k.shape[-2])
        keep = jax.lax.broadcasted_iota(jnp.int32, shape, 1) <= jax.lax.broadcasted_iota(jnp.int32, shape, 0)
        mask = keep if mask is None else jnp.logical_and(mask, keep)
    if mask is not None:
        s = s + jnp.where(mask, f32(0.0), f32(DEFAULT_MASK_VALUE))
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("...qk,...kd->...qd", p, v.astype(f32), preferred_element_type=f32).astype(q.dtype)


# Test hook: True runs jax's TPU kernels off a TPU too, in Pallas's TPU interpreter (tests/test_compat_custom_kernel.py
# sets it to check the kernel path against the XLA formulation on the CPU).
_TPU_KERNELS_EVERYWHERE = False


def _tpu_kernels() -> bool:
    """Whether attention runs jax's Pallas TPU kernels: on a TPU (or under the test hook), and not in SPMD mode
    (a Mosaic kernel is opaque to XLA's partitioner, which partitions the XLA formulation from the shardings)."""
    return (devices.platform() == "tpu" or _TPU_KERNELS_EVERYWHERE) and not devices.spmd_enabled()


def _fits_pallas_flash(q, k, v, ab) -> bool:
    """Whether jax's TPU flash attention takes these shapes: lengths in whole 128-blocks (its smallest block), a head
    dimension below 128 or a multiple of it, one float dtype (float32 or bfloat16), a full ``ab``."""
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    return (
        lq % tpu_flash.MIN_BLOCK_SIZE == 0
        and lk % tpu_flash.MIN_BLOCK_SIZE == 0
        and (d < tpu_flash.MIN_BLOCK_SIZE or d % tpu_flash.MIN_BLOCK_SIZE == 0)
        and q.dtype == k.dtype == v.dtype
        and q.dtype in (torch.float32, torch.bfloat16)
        and (ab is None or tuple(ab.shape) == (*q.shape[:-1], lk))
    )


def _pallas_attention(q, k, v, ab, q_segment_ids, kv_segment_ids, *, causal: bool, sm_scale: float):
    """jax's Pallas TPU flash attention (``_attention``'s semantics), leading batch dimensions folded into one."""
    lq, lk = q.shape[-2], k.shape[-2]
    batch_shape = q.shape[:-2]
    q, k, v = (t.reshape(-1, *t.shape[-3:]) for t in (q, k, v))
    if ab is not None:
        ab = ab.reshape(-1, *ab.shape[-3:])
    if q_segment_ids is not None:
        q_segment_ids = q_segment_ids.reshape(-1, lq).astype(jnp.int32)
        kv_segment_ids = kv_segment_ids.reshape(-1, lk).astype(jnp.int32)
    flash = _flash_kernel(bool(causal), float(sm_scale), _flash_blocks(q.shape[0], lq, lk))
    kernel = _kernel_call(flash, _COMPILES_TPU)
    return kernel(q, k, v, ab, q_segment_ids, kv_segment_ids).reshape(*batch_shape, lq, q.shape[-1])


def _block(length: int, largest: int) -> int:
    """The largest of ``largest``, ``largest / 2``, ... (128 at least) that divides ``length``."""
    while length % largest:
        largest //= 2
    return largest


def _flash_blocks(batch: int, lq: int, lk: int) -> tpu_flash.BlockSizes:
    """torch_xla's block sizes (``FlashAttention.DEFAULT_BLOCK_SIZES``), halved until they divide the lengths."""
    return tpu_flash.BlockSizes(
        block_q=_block(lq, 512),
        block_k_major=_block(lk, 512),
        block_k=_block(lk, 512),
        block_b=2 if batch % 2 == 0 else 1,
        block_q_major_dkv=_block(lq, 512),
        block_k_major_dkv=_block(lk, 512),
        block_k_dkv=_block(lk, 512),
        block_q_dkv=_block(lq, 512),
        block_k_major_dq=_block(lk, 512),
        block_k_dq=_block(lk, 256),
        block_q_dq=_block(lq, 1024),
    )


@functools.cache
def _flash_kernel(causal: bool, sm_scale: float, blocks: tpu_flash.BlockSizes) -> Callable:
    def kernel(q, k, v, ab, q_segment_ids, kv_segment_ids):
        segment_ids = None if q_segment_ids is None else tpu_flash.SegmentIds(q_segment_ids, kv_segment_ids)
        return tpu_flash.flash_attention(q, k, v, ab, segment_ids, causal=causal, sm_scale=sm_scale, block_sizes=blocks)

    return kernel


class FlashAttention:
    """torch_xla's ``FlashAttention`` autograd function, by name: ``apply`` is :func:`flash_attention`'s positional
    form (lazyxla's autograd is ``jax.vjp``'s); the class constants are torch_xla's.

    Example::

        o = FlashAttention.apply(q, k, v, True, None, None, 1.0, None, None, None)
    """

    MIN_BLOCK_SIZE = 128
    DEFAULT_MASK_VALUE = DEFAULT_MASK_VALUE
    NUM_LANES = 128
    NUM_SUBLANES = 8

    @staticmethod
    def apply(q, k, v, causal, q_segment_ids, kv_segment_ids, sm_scale, ab, partition_spec, mesh):
        return flash_attention(
            q, k, v, causal, q_segment_ids, kv_segment_ids, sm_scale, ab=ab, partition_spec=partition_spec, mesh=mesh
        )


# ---- grouped matmul ------------------------------------------------------------------------------------------------


def gmm(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    group_sizes: torch.Tensor,
    tiling: tuple[int, int, int] | None = None,
    group_offset: torch.Tensor | None = None,
    transpose_rhs: bool = False,
) -> torch.Tensor:
    """``lhs[sizes[i-1]:sizes[i], :] @ rhs[i]`` for each group ``i``: lhs ``[m, k]``, rhs ``[groups, k, n]``
    (``[groups, n, k]`` with ``transpose_rhs``), group_sizes int32 ``[groups]``; rows past the groups' total are 0.
    ``jax.lax.ragged_dot`` (``tiling`` is the TPU kernel's and not needed). Differentiable.

    Example::

        out = gmm(tokens, expert_weights, torch.tensor([3, 0, 5], dtype=torch.int32).to(dev))
    """
    if group_offset is not None:
        raise NotImplementedError(
            "torch_xla.experimental.custom_kernel.gmm: group_offset (a shard of the groups) is not supported on "
            "lazyxla; pass the full rhs and group_sizes (XLA partitions the ragged_dot from their shardings)"
        )
    return lazyxla.call_jax(_gmm, lhs, rhs, group_sizes, transpose_rhs=bool(transpose_rhs))


def _gmm(lhs, rhs, group_sizes, *, transpose_rhs: bool):
    if transpose_rhs:
        rhs = jnp.swapaxes(rhs, 1, 2)
    return jax.lax.ragged_dot(lhs, rhs, group_sizes.astype(jnp.int32), preferred_element_type=lhs.dtype)


def tgmm(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    group_sizes: torch.Tensor,
    tiling: tuple[int, int, int] = (512, 512, 512),
    group_offset: torch.Tensor | None = None,
    num_actual_groups: int | None = None,
) -> torch.Tensor:
    """``lhs[:, sizes[i-1]:sizes[i]] @ rhs[sizes[i-1]:sizes[i], :]`` for each group ``i``: lhs ``[k, m]``, rhs
    ``[m, n]``, out ``[groups, k, n]`` (the weight gradient of :func:`gmm`). Exact XLA (a ragged contraction).

    Example::

        grad_w = tgmm(tokens.t(), grad_out, group_sizes)
    """
    if group_offset is not None or num_actual_groups is not None:
        raise NotImplementedError(
            "torch_xla.experimental.custom_kernel.tgmm: group_offset/num_actual_groups are not supported on lazyxla; "
            "pass the full group_sizes"
        )
    return lazyxla.call_jax(_tgmm, lhs, rhs, group_sizes)


def _tgmm(lhs, rhs, group_sizes):
    groups = group_sizes.shape[0]
    ends = jnp.cumsum(group_sizes.astype(jnp.int32))
    rows = jnp.arange(lhs.shape[1], dtype=jnp.int32)
    group_of_row = jnp.searchsorted(ends, rows, side="right")  # = groups past the last group: in no group
    onehot = (group_of_row[None, :] == jnp.arange(groups, dtype=jnp.int32)[:, None]).astype(lhs.dtype)
    return jnp.einsum("km,gm,mn->gkn", lhs, onehot, rhs, preferred_element_type=lhs.dtype)


def gmm_backward(grad, lhs, rhs, group_sizes, tiling=(512, 512, 512)):
    """The gradients of :func:`gmm` (lhs ``[m, k]``, rhs ``[groups, k, n]``): ``(grad_lhs, grad_rhs)``.

    Example::

        grad_lhs, grad_rhs = gmm_backward(grad_out, lhs, rhs, group_sizes)
    """
    return gmm(grad, rhs.transpose(-1, -2), group_sizes, tiling), tgmm(lhs.t(), grad, group_sizes, tiling)


class GMM(torch.autograd.Function):
    """torch_xla's ``GMM``: :func:`gmm` with :func:`gmm_backward` as its backward.

    Example::

        out = GMM.apply(lhs, rhs, group_sizes)
    """

    @staticmethod
    def forward(ctx, lhs, rhs, group_sizes, tiling=(512, 512, 512)):
        ctx.save_for_backward(lhs, rhs, group_sizes)
        ctx.tiling = tiling
        return gmm(lhs, rhs, group_sizes, tiling)

    @staticmethod
    def backward(ctx, grad_output):
        lhs, rhs, group_sizes = ctx.saved_tensors
        grad_lhs, grad_rhs = gmm_backward(grad_output, lhs, rhs, group_sizes, ctx.tiling)
        return grad_lhs, grad_rhs, None, None


# ---- quantized matmul ----------------------------------------------------------------------------------------------


def quantized_matmul_int8(
    x: torch.Tensor,
    w: torch.Tensor,
    scalar: torch.Tensor,
    zero_point: torch.Tensor | None = None,
    quant_block_size: torch.Tensor | None = None,
    quantize_activation: bool = False,
    batch_block_size: int | None = None,
    out_block_size: int | None = None,
    in_block_size: int | None = None,
) -> torch.Tensor:
    """torch_xla's w8a8 matmul: ``x [..., in] @ w.T * scalar`` with ``w`` int8 ``[out, in]`` and ``scalar [out]``
    (a float scale per output channel, used in float32), in x's dtype. With ``quantize_activation`` each row of x is
    quantized to int8 first (``scale = max|x| / 127`` in x's dtype, ``x_int = round(x / scale)``), the matmul runs
    int8 x int8 -> int32 and the result is multiplied by the row's scale, as torch_xla's Pallas kernel does. An exact
    XLA formulation on every platform, one :func:`lazyxla.call_jax` node; the block sizes (the kernel's tiling) are
    accepted and not needed.

    Example::

        w_int8, scalar = ...                      # per-channel symmetric quantization of a [out, in] weight
        y = quantized_matmul_int8(x, w_int8, scalar, quantize_activation=True)
    """
    if zero_point is not None or quant_block_size is not None:
        raise NotImplementedError(
            "torch_xla.experimental.custom_kernel.quantized_matmul_int8 takes no zero_point or quant_block_size "
            "(torch_xla's kernel asserts they are None); use torch_xla.experimental.xla_quantized_matmul."
            "quantized_matmul_xla(x, w, scaler, zero_point, block_size=...) for asymmetric or blockwise weights"
        )
    _check_per_channel(x.shape[-1], w.shape[0], w, scalar, None)
    return lazyxla.call_jax(_int8_matmul, x, w, scalar, quantize_activation=bool(quantize_activation))


def _int8_matmul(x, w, scalar, *, quantize_activation: bool):
    """The kernel's math: the per-channel quantized matmul with a float32 scale, cast back to x's dtype."""
    out = _xla_quantized_matmul(
        x,
        w,
        scalar.astype(jnp.float32),
        None,
        block_size=-1,
        int4_weight=False,
        quantize_activation=quantize_activation,
    )
    return out.astype(x.dtype)


# ---- what lazyxla does not provide ----------------------------------------------------------------------------------

_KERNEL_HINT = (
    "jax's own kernel (jax.experimental.pallas.ops.tpu...) through make_kernel_from_pallas or lazyxla.call_jax "
    "(on a TPU), or the attention written in PyTorch"
)
trace_pallas = stub(
    "torch_xla.experimental.custom_kernel.trace_pallas (the TPU custom call's payload)",
    "make_kernel_from_pallas or lazyxla.call_jax, which run the JAX function itself",
)


def __getattr__(name: str) -> Any:
    raise missing_attribute(__name__, name)


# ---- torch.ops.xla.<name>: torch_xla's custom ops for these kernels (torch_xla registers them when this module is
# imported; vLLM and torch_xla-style models call them) ----------------------------------------------------------------


def non_xla_attetion(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_type: str) -> torch.Tensor:
    """torch_xla's attention ops off its device (its spelling): ``empty_like(q)``, the output's shape for fake-tensor
    tracing, with a warning unless ``k`` is a meta tensor.

    Example::

        non_xla_attetion(q_meta, k_meta, v_meta, "flash").shape == q_meta.shape
    """
    warn_off_device(k, f"{attention_type} attention")
    return torch.empty_like(q)


def flash_attention_xla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """``torch.ops.xla.flash_attention(q, k, v, causal)`` on lazyxla tensors: :func:`flash_attention`.

    Example::

        o = torch.ops.xla.flash_attention(q, k, v, True)
    """
    return flash_attention(q, k, v, causal=causal)


def flash_attention_non_xla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """``torch.ops.xla.flash_attention`` elsewhere: ``empty_like(q)`` (torch_xla's, for shape inference).

    Example::

        torch.ops.xla.flash_attention(q.to("meta"), k.to("meta"), v.to("meta")).shape
    """
    return non_xla_attetion(q, k, v, "flash")


def gmm_xla(lhs, rhs, group_sizes, tiling=None, group_offset=None, transpose_rhs=False) -> torch.Tensor:
    """``torch.ops.xla.gmm`` on lazyxla tensors: :func:`gmm` (lhs ``[m, k]``, rhs ``[groups, k, n]``).

    Example::

        out = torch.ops.xla.gmm(tokens, expert_weights, group_sizes)
    """
    if lhs.dim() != 2 or rhs.dim() != 3:
        raise ValueError(f"torch.ops.xla.gmm takes a 2-d lhs and a 3-d rhs, got {lhs.dim()}-d and {rhs.dim()}-d")
    return gmm(lhs, rhs, group_sizes, tuple(tiling) if tiling else None, group_offset, transpose_rhs)


def gmm_non_xla(lhs, rhs, group_sizes, tiling=None, group_offset=None, transpose_rhs=False) -> torch.Tensor:
    """``torch.ops.xla.gmm`` elsewhere: an empty ``[m, n]`` tensor (torch_xla's, for shape inference).

    Example::

        torch.ops.xla.gmm(lhs.to("meta"), rhs.to("meta"), sizes.to("meta")).shape   # (m, n)
    """
    warn_off_device(lhs, "gmm")
    if lhs.dim() != 2 or rhs.dim() != 3:
        raise ValueError(f"torch.ops.xla.gmm takes a 2-d lhs and a 3-d rhs, got {lhs.dim()}-d and {rhs.dim()}-d")
    return torch.empty(lhs.shape[0], rhs.shape[1] if transpose_rhs else rhs.shape[2], device=lhs.device)


def quantized_matmul_int8_xla(x, w, scalar, zero_point=None, quant_block_size=None, quantize_activation=False,
                              batch_block_size=None, out_block_size=None, in_block_size=None):  # fmt: skip
    """``torch.ops.xla.quantized_matmul_int8`` on lazyxla tensors: :func:`quantized_matmul_int8`.

    Example::

        out = torch.ops.xla.quantized_matmul_int8(x, w_int8, scale, quantize_activation=True)
    """
    return quantized_matmul_int8(x, w, scalar, zero_point, quant_block_size, quantize_activation,
                                 batch_block_size, out_block_size, in_block_size)  # fmt: skip


def quantized_matmul_int8_non_xla(x, w, scalar, zero_point=None, quant_block_size=None, quantize_activation=False,
                                  batch_block_size=None, out_block_size=None, in_block_size=None):  # fmt: skip
    """``torch.ops.xla.quantized_matmul_int8`` elsewhere: an empty ``[batch, out]`` tensor (torch_xla's).

    Example::

        torch.ops.xla.quantized_matmul_int8(x.to("meta"), w.to("meta"), scale.to("meta")).shape
    """
    warn_off_device(x, "quantized_matmul_int8")
    return torch.empty(x.shape[0], w.shape[0], device=x.device, dtype=x.dtype)


register("flash_attention", "flash_attention(Tensor q, Tensor k, Tensor v, bool casual=False) -> Tensor",
         flash_attention_xla, flash_attention_non_xla, probes=3)  # fmt: skip
register(
    "gmm",
    "gmm(Tensor lhs, Tensor rhs, Tensor group_sizes, int[]? tiling=None, Tensor? group_offset=None,"
    " bool transpose_rhs=False) -> Tensor",
    gmm_xla,
    gmm_non_xla,
)
register(
    "quantized_matmul_int8",
    "quantized_matmul_int8(Tensor x, Tensor w, Tensor scalar, Tensor? zero_point=None, Tensor? quant_block_size=None,"
    " bool quantize_activation=False, int? batch_block_size=None, int? out_block_size=None,"
    " int? in_block_size=None) -> Tensor",
    quantized_matmul_int8_xla,
    quantized_matmul_int8_non_xla,
)
