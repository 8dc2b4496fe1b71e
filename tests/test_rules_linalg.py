"""Matrix products and linear algebra (rules/linalg.py) against CPU eager, with gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from tests.util import check
from tests.util import normal as _r

TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "a,b",
    [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4,)), ((3, 4), (4,)), ((4,), (2, 4, 3))],
    ids=str,
)
def test_matmul(a, b):
    check(torch.matmul, _r(*a), _r(*b, seed=1), grad=True, **TOL)


def test_products():
    check(torch.mm, _r(3, 4), _r(4, 2, seed=1), grad=True, **TOL)
    check(torch.bmm, _r(2, 3, 4), _r(2, 4, 2, seed=1), grad=True, **TOL)
    check(torch.mv, _r(3, 4), _r(4, seed=1), grad=True, **TOL)
    check(torch.dot, _r(4), _r(4, seed=1), grad=True, **TOL)
    check(torch.vdot, _r(4), _r(4, seed=1), **TOL)
    check(torch.outer, _r(3), _r(4, seed=1), grad=True, **TOL)
    check(lambda x, w, b: F.linear(x, w, b), _r(2, 3, 4), _r(5, 4, seed=1), _r(5, seed=2), grad=True, **TOL)


@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, -1), (0, 1.5)])
def test_add_products(beta, alpha):
    kw = dict(beta=beta, alpha=alpha)
    check(lambda c, a, b: torch.addmm(c, a, b, **kw), _r(3, 2), _r(3, 4, seed=1), _r(4, 2, seed=2), grad=True, **TOL)
    check(lambda c, a, b: torch.addmm(c, a, b, **kw), _r(2), _r(3, 4, seed=1), _r(4, 2, seed=2), grad=True, **TOL)
    check(lambda c, a, b: torch.baddbmm(c, a, b, **kw), _r(2, 3, 2), _r(2, 3, 4, seed=1), _r(2, 4, 2, seed=2),
          grad=True, **TOL)  # fmt: skip
    check(lambda c, a, b: torch.addbmm(c, a, b, **kw), _r(3, 2), _r(2, 3, 4, seed=1), _r(2, 4, 2, seed=2),
          grad=True, **TOL)  # fmt: skip
    check(lambda c, a, b: torch.addmv(c, a, b, **kw), _r(3), _r(3, 4, seed=1), _r(4, seed=2), grad=True, **TOL)
    check(lambda c, a, b: torch.addr(c, a, b, **kw), _r(3, 4), _r(3, seed=1), _r(4, seed=2), grad=True, **TOL)


@pytest.mark.parametrize(
    "op,shapes",
    [
        (torch.addmm, [(3, 2), (3, 4), (4, 2)]),
        (torch.baddbmm, [(2, 3, 2), (2, 3, 4), (2, 4, 2)]),
        (torch.addbmm, [(3, 2), (2, 3, 4), (2, 4, 2)]),
        (torch.addmv, [(3,), (3, 4), (4,)]),
        (torch.addr, [(3, 4), (3,), (4,)]),
    ],
)
def test_coefficients_that_change_between_calls(op, shapes):
    # the second call of a signature takes the recorder's fast path, which lists keyword inputs in sorted order
    # (alpha, beta): the general path took them in the caller's order (beta, alpha), so the values were swapped
    dev = lazyxla.device()
    xs = [_r(*s, grad=False, seed=i) for i, s in enumerate(shapes)]
    for beta, alpha in ((0.2, 0.6), (0.5, 0.7), (2.5, -3.5), (0.3, 1.25)):
        got = op(*[x.to(dev) for x in xs], beta=beta, alpha=alpha)
        torch.testing.assert_close(got.cpu(), op(*xs, beta=beta, alpha=alpha), **TOL)
    assert lazyxla.metrics.counters()["compiles"] == 1  # the coefficients are program inputs


def test_addmm_beta_zero_ignores_nan():
    c = torch.full((3, 2), float("nan"))
    check(lambda c, a, b: torch.addmm(c, a, b, beta=0), c, _r(3, 4, seed=1), _r(4, 2, seed=2), **TOL)


def _spd(n, seed=0):
    a = _r(n, n, grad=False, seed=seed, dtype=torch.float64)
    return (a @ a.T + n * torch.eye(n, dtype=torch.float64)).requires_grad_()


def test_solvers_and_decompositions():
    tol = dict(rtol=1e-6, atol=1e-8)
    a = _spd(4)
    check(torch.linalg.cholesky, a, grad=True, **tol)
    check(lambda a: torch.linalg.cholesky(a, upper=True), a, **tol)
    check(torch.linalg.inv, a, grad=True, **tol)
    check(torch.linalg.det, _r(2, 3, 3, dtype=torch.float64), grad=True, **tol)
    check(torch.linalg.slogdet, _r(3, 3, dtype=torch.float64), grad=True, **tol)
    check(torch.linalg.solve, a, _r(4, 2, dtype=torch.float64, seed=3), grad=True, **tol)
    check(torch.linalg.solve, _r(2, 3, 3, dtype=torch.float64), _r(2, 3, dtype=torch.float64, seed=3), grad=True, **tol)
    check(lambda a, b: torch.linalg.solve(a, b, left=False), a, _r(2, 4, dtype=torch.float64, seed=3), grad=True,
          **tol)  # fmt: skip
    check(lambda a: torch.linalg.eigvalsh(a), a, grad=True, **tol)
    check(lambda a: torch.linalg.svdvals(a), _r(4, 3, dtype=torch.float64), grad=True, **tol)
    lower = torch.tril(_spd(4, seed=1)).detach().requires_grad_()
    b = _r(4, 2, dtype=torch.float64, seed=2)
    check(lambda a, b: torch.linalg.solve_triangular(a, b, upper=False), lower, b, grad=True, **tol)


def test_qr_reconstructs():
    a = _r(5, 3, grad=False, dtype=torch.float64)
    q, r = torch.linalg.qr(a.to(lazyxla.device()))
    torch.testing.assert_close((q @ r).cpu(), a)
    torch.testing.assert_close((q.T @ q).cpu(), torch.eye(3, dtype=torch.float64))
    assert torch.allclose(torch.triu(r).cpu(), r.cpu())


def test_matrix_power_zero():
    # n=0 is the identity: PyTorch builds it with eye (whose out= kernel would resize its output)
    check(lambda a: torch.linalg.matrix_power(a, 0), _r(2, 3, 3), grad=True, **TOL)
    check(lambda a: torch.linalg.matrix_power(a, 3), _r(2, 3, 3), grad=True, **TOL)
