"""Rules for matrix products and linear algebra."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg
import torch
from jax import lax

from lazyxla.lowering.registry import lowers
from lazyxla.lowering.rules.common import jax_gelu

aten = torch.ops.aten


# Matmul and convolution precision is not set per rule: the compile cache lowers every graph inside
# jax.default_matmul_precision(config.matmul_precision), a compile-key flag.


def matmul(a, b):
    return jnp.matmul(a, b)


def _scaled(x, s):
    # 1 stays a constant (see lazy.meta._CONST_FLOATS): skip the multiply
    return x if isinstance(s, (int, float)) and s == 1 else x * s


def _add_scaled(ctx, inp, prod, beta, alpha):
    """``beta * inp + alpha * prod``; with beta == 0 ``inp`` is ignored, NaNs included, as in PyTorch."""
    out = _scaled(prod, alpha)
    if isinstance(beta, (int, float)):
        if beta == 0:
            return jnp.broadcast_to(out, ctx.shape)
        return _scaled(inp, beta) + out
    # an input (a multi-process run makes every coefficient one, 0 included: lazy/meta.py)
    return jnp.where(beta == 0, jnp.zeros((), inp.dtype), inp * beta) + out


@lowers(aten.mm.default, aten.bmm.default, aten.mv.default, aten.dot.default)
def _matmul(ctx, a, b):
    return matmul(a, b)


@lowers(aten.vdot.default)
def _vdot(ctx, a, b):
    return matmul(jnp.conj(a), b)


@lowers(aten.addmm.default, aten.baddbmm.default, aten.addmv.default)
def _addmm(ctx, inp, a, b, *, beta=1, alpha=1):
    return _add_scaled(ctx, inp, matmul(a, b), beta, alpha)


@lowers(aten.addbmm.default)
def _addbmm(ctx, inp, a, b, *, beta=1, alpha=1):
    return _add_scaled(ctx, inp, matmul(a, b).sum(0), beta, alpha)


@lowers(aten.addr.default)
def _addr(ctx, inp, u, v, *, beta=1, alpha=1):
    return _add_scaled(ctx, inp, jnp.outer(u, v), beta, alpha)


@lowers(aten._addmm_activation.default)
def _addmm_activation(ctx, inp, a, b, *, beta=1, alpha=1, use_gelu=False):
    out = _add_scaled(ctx, inp, matmul(a, b), beta, alpha)
    return jax_gelu(out, "tanh") if use_gelu else jnp.maximum(out, 0)


# ---- decompositions and solvers (float32/64; multi-output ops return PyTorch's tuple) ----


@lowers(aten.linalg_cholesky_ex.default)
def _cholesky_ex(ctx, a, *, upper=False, check_errors=False):
    low = jnp.linalg.cholesky(a)
    info = jnp.where(jnp.isnan(low).any((-2, -1)), 1, 0)
    return (jnp.conj(jnp.swapaxes(low, -1, -2)) if upper else low), info


@lowers(aten.linalg_inv_ex.default)
def _inv_ex(ctx, a, *, check_errors=False):
    inv = jnp.linalg.inv(a)
    return inv, jnp.zeros(ctx.avals[1].shape, jnp.int32)


@lowers(aten.linalg_solve_triangular.default)
def _solve_triangular(ctx, a, b, *, upper, left=True, unitriangular=False):
    return lax.linalg.triangular_solve(a, b, left_side=left, lower=not upper, unit_diagonal=unitriangular)


def _lu(a):
    """PyTorch's (LU, pivots): LAPACK's packed factors and 1-based row swaps."""
    lu, piv, _ = lax.linalg.lu(a)
    return lu, piv.astype(jnp.int32) + 1


def _mT(a):
    return jnp.swapaxes(a, -1, -2)


# det and slogdet save the LU of A^T (PyTorch factors A in column-major order), their backward expects it
@lowers(aten._linalg_det.default)
def _det(ctx, a):
    return (jnp.linalg.det(a), *_lu(_mT(a)))


@lowers(aten._linalg_slogdet.default)
def _slogdet(ctx, a):
    return (*jnp.linalg.slogdet(a), *_lu(_mT(a)))


@lowers(aten._linalg_solve_ex.default)
def _solve_ex(ctx, a, b, *, left=True, check_errors=False):
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])
    if not left:  # X A = B  <=>  A^T X^T = B^T
        return (_mT(jnp.linalg.solve(_mT(a), _mT(b))), *_lu(a), jnp.zeros(ctx.avals[3].shape, jnp.int32))
    x = jnp.linalg.solve(a, b[..., None])[..., 0] if vector else jnp.linalg.solve(a, b)
    return (x, *_lu(a), jnp.zeros(ctx.avals[3].shape, jnp.int32))


@lowers(aten.linalg_lu_solve.default)
def _lu_solve(ctx, lu, pivots, b, *, left=True, adjoint=False):
    # X A = B is A^T X^T = B^T; for real matrices the adjoint is the transpose
    transpose = adjoint != (not left)
    b = b if left else _mT(b)
    x = jax.scipy.linalg.lu_solve((lu, pivots - 1), b, trans=1 if transpose else 0)
    return x if left else _mT(x)


@lowers(aten._linalg_check_errors.default)
def _check_errors(ctx, info, api_name, *, is_matrix):
    # errors are not raised lazily: a singular or non-positive-definite input gives inf/NaN, as in jax
    return ()


@lowers(aten.linalg_qr.default)
def _qr(ctx, a, mode="reduced"):
    q, r = jnp.linalg.qr(a, mode="complete" if mode == "complete" else "reduced")
    if mode == "r":
        return jnp.zeros(ctx.avals[0].shape, a.dtype), r
    return q, r


@lowers(aten._linalg_eigh.default)
def _eigh(ctx, a, UPLO="L", compute_v=True):
    w, v = jnp.linalg.eigh(a, UPLO=UPLO, symmetrize_input=False)
    return w, (v if compute_v else jnp.zeros(ctx.avals[1].shape, a.dtype))


@lowers(aten._linalg_svd.default)
def _svd(ctx, a, full_matrices=False, compute_uv=True, driver=None):
    if not compute_uv:
        s = jnp.linalg.svd(a, compute_uv=False)
        return jnp.zeros(ctx.avals[0].shape, a.dtype), s, jnp.zeros(ctx.avals[2].shape, a.dtype)
    return jnp.linalg.svd(a, full_matrices=full_matrices)
