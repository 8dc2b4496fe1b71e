"""0.0 and -0.0 are different Python numbers to an op (1 / x tells them apart), though they compare and hash
equal: a constant recorded as one must not stand for the other (found by the compact-rules work: ``x / 0.0`` then
``x / -0.0`` returned the first one's signs)."""

from __future__ import annotations

import pytest
import torch

import lazyxla

OPS = {
    "div": lambda x, z: x / z,
    "mul": lambda x, z: x * z,
    "full": lambda x, z: 1 / torch.full_like(x, z),
    "where": lambda x, z: 1 / torch.where(x > 100, x, z),
}


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_and_negative_zero_in_turn_match_cpu(dev, name, dtype):
    op = OPS[name]
    x = torch.tensor([1.0, -2.0, 0.5], dtype=dtype)
    for z in (0.0, -0.0, 0.0, -0.0):
        got = op(x.to(dev), z).cpu()
        want = op(x, z)
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=f"{name} with {z!r}")
        assert torch.equal(torch.signbit(got), torch.signbit(want)), (name, z, got, want)


def test_the_two_zeros_are_two_programs_once_each(dev):
    x = torch.ones(3, device=dev)
    for _ in range(2):
        for z in (0.0, -0.0):
            (x / z).cpu()
    assert lazyxla.metrics.counters()["compiles"] <= 2  # one per zero, not one per call
