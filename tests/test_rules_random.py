"""Random ops (rules/random.py, dropout in rules/activation.py): reproducible by seed, fresh per call, right
statistics."""

from __future__ import annotations

import math

import jax
import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla.lowering.rules.common import flat_draw

N = 200_000  # samples for the statistical checks; bounds below are >= 5 standard errors


def _ones(dev, *shape, dtype=torch.float32):
    return torch.ones(shape, dtype=dtype, device=dev)


SAMPLERS = {
    "rand": lambda d: torch.rand(N, device=d),
    "randn": lambda d: torch.randn(N, device=d),
    "randint": lambda d: torch.randint(3, 10, (N,), device=d),
    "rand_like": lambda d: torch.rand_like(_ones(d, N)),
    "randn_like": lambda d: torch.randn_like(_ones(d, N)),
    "randint_like": lambda d: torch.randint_like(_ones(d, N), 2, 7),
    "randint_like_high": lambda d: torch.randint_like(_ones(d, N), 5),
    "uniform_": lambda d: _ones(d, N).uniform_(-2, 3),
    "normal_": lambda d: _ones(d, N).normal_(1.5, 0.5),
    "normal_tensors": lambda d: torch.normal(_ones(d, N) * 2, _ones(d, N) * 3),
    "normal_float_tensor": lambda d: torch.normal(-1.0, _ones(d, N) * 0.5),
    "normal_tensor_float": lambda d: torch.normal(_ones(d, N), 2.0),
    "bernoulli_p": lambda d: _ones(d, N).bernoulli_(0.3),
    "bernoulli": lambda d: torch.bernoulli(_ones(d, N) * 0.7),
    "bernoulli_tensor_": lambda d: _ones(d, N).bernoulli_(_ones(d, N) * 0.2),
    "exponential_": lambda d: _ones(d, N).exponential_(2.0),
    "geometric_": lambda d: _ones(d, N).geometric_(0.25),
    "log_normal_": lambda d: _ones(d, N).log_normal_(0.0, 0.5),
    "cauchy_": lambda d: _ones(d, N).cauchy_(1.0, 2.0),
    "random_": lambda d: _ones(d, N).random_(0, 4),
    "random_to": lambda d: _ones(d, N, dtype=torch.int64).random_(6),
    "random_uint8": lambda d: _ones(d, N, dtype=torch.uint8).random_(),
    "poisson": lambda d: torch.poisson(_ones(d, N) * 3),
    "randperm": lambda d: torch.randperm(1000, device=d),
    "multinomial": lambda d: torch.multinomial(_ones(d, 50, 10), 10),
    "multinomial_replacement": lambda d: torch.multinomial(torch.tensor([1.0, 2, 7], device=d), N, True),
    "dropout": lambda d: F.dropout(_ones(d, N), 0.25),
    "rrelu": lambda d: F.rrelu(-_ones(d, N), training=True),
}


@pytest.mark.parametrize("name", SAMPLERS)
def test_seeded_reproducible_and_fresh(name, dev):
    draw = SAMPLERS[name]
    torch.manual_seed(123)
    a, b = draw(dev).cpu(), draw(dev).cpu()
    torch.manual_seed(123)
    a2 = draw(dev).cpu()
    torch.manual_seed(124)
    c = draw(dev).cpu()
    assert torch.equal(a, a2), "the same seed must give the same numbers"
    assert not torch.equal(a, b), "two calls must draw different numbers"
    assert not torch.equal(a, c), "another seed must give other numbers"
    assert a.dtype == SAMPLERS[name](torch.device("cpu")).dtype


# (sampler, expected mean, expected std, (min, max) or None)
MOMENTS = {
    "rand": (0.5, math.sqrt(1 / 12), (0.0, 1.0)),
    "randn": (0.0, 1.0, None),
    "randint": (6.0, math.sqrt((7**2 - 1) / 12), (3, 9)),
    "rand_like": (0.5, math.sqrt(1 / 12), (0.0, 1.0)),
    "randn_like": (0.0, 1.0, None),
    "randint_like": (4.0, math.sqrt((5**2 - 1) / 12), (2, 6)),
    "randint_like_high": (2.0, math.sqrt((5**2 - 1) / 12), (0, 4)),
    "uniform_": (0.5, 5 / math.sqrt(12), (-2.0, 3.0)),
    "normal_": (1.5, 0.5, None),
    "normal_tensors": (2.0, 3.0, None),
    "normal_float_tensor": (-1.0, 0.5, None),
    "normal_tensor_float": (1.0, 2.0, None),
    "bernoulli_p": (0.3, math.sqrt(0.3 * 0.7), (0, 1)),
    "bernoulli": (0.7, math.sqrt(0.7 * 0.3), (0, 1)),
    "bernoulli_tensor_": (0.2, math.sqrt(0.2 * 0.8), (0, 1)),
    "exponential_": (0.5, 0.5, (0.0, math.inf)),
    "geometric_": (4.0, math.sqrt(0.75) / 0.25, (1, math.inf)),
    "log_normal_": (math.exp(0.125), math.sqrt((math.exp(0.25) - 1) * math.exp(0.25)), (0.0, math.inf)),
    "random_": (1.5, math.sqrt((4**2 - 1) / 12), (0, 3)),
    "random_to": (2.5, math.sqrt((6**2 - 1) / 12), (0, 5)),
    "random_uint8": (127.5, math.sqrt((256**2 - 1) / 12), (0, 255)),
    "poisson": (3.0, math.sqrt(3.0), (0, math.inf)),
    "dropout": (1.0, math.sqrt(1 / 3), (0.0, 4 / 3 + 1e-6)),
    "rrelu": (-(1 / 8 + 1 / 3) / 2, (1 / 3 - 1 / 8) / math.sqrt(12), (-1 / 3 - 1e-6, -1 / 8 + 1e-6)),
}


@pytest.mark.parametrize("name", MOMENTS)
def test_moments(name, dev):
    mean, std, bounds = MOMENTS[name]
    torch.manual_seed(0)
    x = SAMPLERS[name](dev).cpu().double()
    assert abs(x.mean().item() - mean) < 5 * std / math.sqrt(N) + 1e-9, (x.mean(), mean)
    assert abs(x.std().item() - std) < 0.02 * std, (x.std(), std)
    if bounds is not None:
        lo, hi = bounds
        assert lo <= x.min().item() and x.max().item() <= hi, (x.min(), x.max())
    if name.startswith(("randint", "random")):  # every integer of the range occurs
        assert x.unique().numel() == bounds[1] - bounds[0] + 1


def test_uniform_half_open_and_cauchy_median(dev):
    torch.manual_seed(0)
    assert SAMPLERS["rand"](dev).cpu().max() < 1.0
    c = SAMPLERS["cauchy_"](dev).cpu()
    assert abs(c.median().item() - 1.0) < 0.05
    assert abs((c - 1).abs().median().item() - 2.0) < 0.05  # the scale is the median absolute deviation


def test_randperm_and_multinomial(dev):
    torch.manual_seed(0)
    p = SAMPLERS["randperm"](dev).cpu()
    assert p.dtype == torch.int64 and torch.equal(p.sort().values, torch.arange(1000))
    m = SAMPLERS["multinomial"](dev).cpu()
    assert m.shape == (50, 10) and all(torch.equal(row.sort().values, torch.arange(10)) for row in m)
    counts = torch.bincount(SAMPLERS["multinomial_replacement"](dev).cpu(), minlength=3).double() / N
    torch.testing.assert_close(counts, torch.tensor([0.1, 0.2, 0.7], dtype=torch.float64), atol=5e-3, rtol=0)
    # without replacement, heavier categories come first more often
    w = torch.tensor([1.0, 1, 1, 10], device=dev).expand(4000, 4)
    first = torch.multinomial(w, 2)[:, 0].cpu()
    assert abs((first == 3).double().mean().item() - 10 / 13) < 0.03


def test_half_precision_draws(dev):
    torch.manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        x = torch.randn(N, device=dev, dtype=dtype).cpu().double()
        assert x.dtype == torch.float64 and abs(x.mean()) < 0.02 and abs(x.std() - 1) < 0.02
        u = torch.rand(N, device=dev, dtype=dtype).cpu()
        assert u.min() >= 0 and u.max() <= 1


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_mask_and_gradient(p, dev):
    torch.manual_seed(0)
    x = (torch.rand(400, 500) + 0.5).to(dev).requires_grad_()
    y = F.dropout(x, p)
    g = torch.randn(400, 500)
    y.backward(g.to(dev))
    y, xc, grad = y.detach().cpu(), x.detach().cpu(), x.grad.cpu()
    kept = y != 0
    assert abs(1 - kept.double().mean().item() - p) < 5 * math.sqrt(p * (1 - p) / kept.numel())
    torch.testing.assert_close(y[kept], xc[kept] / (1 - p))
    # the gradient uses the same mask and scale as the forward
    torch.testing.assert_close(grad, torch.where(kept, g / (1 - p), 0))


def test_dropout_p_one_and_modules(dev):
    torch.manual_seed(0)
    x = torch.ones(10, 10, device=dev)
    assert torch.equal(F.dropout(x, 1.0).cpu(), torch.zeros(10, 10))
    layer = torch.nn.Dropout(0.5).to(dev)
    assert (layer(x).cpu() == 0).any()
    layer.eval()
    assert torch.equal(layer(x).cpu(), x.cpu())
    for fn in (lambda t: F.dropout2d(t, 0.5), lambda t: F.alpha_dropout(t, 0.5, True)):
        out = fn(torch.ones(8, 16, 4, 4, device=dev)).cpu()
        assert out.isfinite().all() and not torch.equal(out, torch.ones(8, 16, 4, 4))


def test_attention_dropout(dev):
    torch.manual_seed(0)
    q = torch.randn(2, 2, 8, 4).to(dev).requires_grad_()
    out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5, is_causal=True)
    out.sum().backward()
    ref = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    out, ref, grad = out.detach().cpu(), ref.detach().cpu(), q.grad.cpu()
    assert out.isfinite().all() and grad.isfinite().all() and not torch.allclose(out, ref)
    torch.manual_seed(0)
    again = F.scaled_dot_product_attention(q.detach(), q.detach(), q.detach(), dropout_p=0.5, is_causal=True)
    torch.testing.assert_close(again.cpu(), out)


def test_random_steps_compile_once(dev):
    # the key is a graph input: a new step, and a new seed, reuse the compiled program
    def step():
        x = torch.ones(64, device=dev)
        y = F.dropout(x, 0.5) + torch.randn(64, device=dev)
        lazyxla.sync()
        return y.cpu()

    seen = [step()]
    compiles = lazyxla.metrics.counters().get("compiles", 0)
    seen.append(step())
    torch.manual_seed(5)
    seen.append(step())
    assert lazyxla.metrics.counters().get("compiles", 0) == compiles
    assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])


@pytest.mark.parametrize("sampler", ["uniform", "normal", "exponential", "cauchy", "randint"])
def test_flat_draws_are_the_shaped_draws(sampler):
    # rules draw over the element count and reshape (a 5-d draw compiled ~6x slower): the values must be exactly
    # those of the shaped draw, so that a tensor's random values do not depend on how the rule draws them
    key = jax.random.PRNGKey(7)
    draw = getattr(jax.random, sampler)
    args = (0, 10) if sampler == "randint" else ()
    shape = (2, 3, 1, 4, 5)
    assert (flat_draw(draw, key, shape, *args) == draw(key, shape, *args)).all()


def test_randn_of_a_shape_is_its_flat_draw_reshaped():
    # a 5-d randn holds the values of the same count drawn 1-d with the same seed (one RNG stream, any shape)
    dev = lazyxla.device()
    torch.manual_seed(3)
    a = torch.randn(2, 3, 6, 7, 2, device=dev).cpu()
    torch.manual_seed(3)
    b = torch.randn(504, device=dev).cpu()
    assert torch.equal(a.reshape(-1), b)
