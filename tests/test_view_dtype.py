"""``Tensor.view(dtype)`` against CPU eager, bit for bit, where XLA's bitcast cannot go directly: bool (bitcast
as uint8) and complex (bitcast as its real and imaginary pairs), to and from every size (PyTorch's
test_view_ops: test_view_dtype_new)."""

from __future__ import annotations

import pytest
import torch

import lazyxla

OTHERS = [torch.uint8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32]
PAIRS = [(a, b) for a in (torch.complex64, torch.complex128, torch.bool) for b in OTHERS + [torch.complex64]]
PAIRS += [(b, a) for a, b in PAIRS if a != b]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    flat = t.reshape(-1)
    return flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)


def _source(dtype, shape):
    torch.manual_seed(0)
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape).bool()
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    return torch.randint(0, 100, shape).to(dtype)


@pytest.mark.parametrize("src,dst", PAIRS, ids=lambda d: str(d).split(".")[-1])
def test_view_dtype_bits_equal_cpu(src, dst):
    x = _source(src, (3, 16))  # 16 columns: a whole number of elements for every pair
    want = x.view(dst)
    got = x.to(lazyxla.device()).view(dst).cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(_bytes(got), _bytes(want))


@pytest.mark.parametrize("src,dst", [(torch.complex64, torch.int64), (torch.float64, torch.complex64)])
def test_view_dtype_zero_dim_same_size(src, dst):
    x = _source(src, ())
    got = x.to(lazyxla.device()).view(dst).cpu()
    assert got.shape == () and torch.equal(_bytes(got), _bytes(x.view(dst)))


@pytest.mark.parametrize(
    "src,dst",
    [
        (torch.int32, torch.int8),
        (torch.int8, torch.int32),
        (torch.complex128, torch.int16),
        (torch.float16, torch.complex64),
    ],
    ids=lambda d: str(d).split(".")[-1],
)
def test_view_dtype_of_an_empty_tensor(src, dst):
    """An empty tensor's last dim is grown or shrunk as on the CPU (the lowering inferred a -1 size from no
    elements: ZeroDivisionError)."""
    x = torch.zeros(0, 5, 64, dtype=src)
    got = x.to(lazyxla.device()).view(dst).cpu()
    assert got.dtype == dst and got.shape == x.view(dst).shape
