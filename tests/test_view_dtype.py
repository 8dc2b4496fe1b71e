"""``Tensor.view(dtype)`` against CPU eager, bit for bit, where XLA's bitcast cannot go directly: bool (bitcast
as uint8) and complex (bitcast as its real and imaginary pairs), to and from every size (PyTorch's
test_view_ops: test_view_dtype_new)."""

from __future__ import annotations

import re

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


# views whose CPU layout the CPU can view as another dtype (last dim contiguous), each with a storage offset or not
VIEWS = {
    "whole": lambda x: x,
    "rows": lambda x: x[1:],
    "columns": lambda x: x[:, 4:],
    "row": lambda x: x[2],
    "permuted": lambda x: x.t().t()[1:],
    "narrowed": lambda x: x.narrow(1, 8, 8),
}


@pytest.mark.parametrize("view", VIEWS, ids=str)
@pytest.mark.parametrize("dst", [torch.int8, torch.float16, torch.int32, torch.float64, torch.complex128], ids=str)
def test_view_dtype_data_ptr_is_the_cpu_offset(view, dst):
    """``x[1:].view(dtype)`` starts where ``x[1:]`` does, as on the CPU: a dtype view has no ``_base``, so its CPU
    layout was unknown and its ``data_ptr`` was its storage's start (PyTorch's test_view_dtype_new). Views of the
    dtype view, and the view back to the first dtype, start where the CPU's do too."""
    x = torch.arange(4 * 16, dtype=torch.float32).reshape(4, 16)
    d = x.to(lazyxla.device())
    for base in (x, d):
        assert base.data_ptr() != 0
    for make in (
        lambda t: VIEWS[view](t).view(dst),
        lambda t: VIEWS[view](t).view(dst)[..., 1:],
        lambda t: VIEWS[view](t).view(dst).view(torch.float32),
    ):
        try:
            want = make(x)
        except RuntimeError as e:  # an offset or size the CPU cannot view: the same error on lazyxla
            with pytest.raises(RuntimeError, match=re.escape(str(e).split("\n")[0])):
                make(d)
            continue
        got = make(d)
        assert got.data_ptr() - d.data_ptr() == want.data_ptr() - x.data_ptr()
        assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("src,dst", [(torch.float32, torch.float64), (torch.int8, torch.int32)], ids=str)
def test_view_dtype_to_a_larger_size_checks_the_cpu_offset_and_strides(src, dst):
    """Viewing to a larger element size needs a storage offset and strides that are multiples of the size ratio.
    PyTorch's check read the wrapper's offset (0 for every view) and strides (contiguous): ``x[:, 1:]`` was viewed
    from the wrong start instead of raising the CPU's error (PyTorch's test_view_dtype_upsize_errors)."""
    ratio = dst.itemsize // src.itemsize
    x = torch.zeros(4, 4, ratio + 1, dtype=src)
    for bad in (
        lambda t: t[:, :, 1:].view(dst),
        lambda t: t.view(-1)[: 4 * ratio].view(dst)[1:].view(src)[1 : 1 + ratio].view(dst),  # through a dtype view
        lambda t: t[:, :, :ratio].as_strided((4, 4, ratio), (ratio, 1, 1)).view(dst),
    ):
        with pytest.raises(RuntimeError) as cpu:
            bad(x)
        with pytest.raises(RuntimeError) as got:
            bad(x.to(lazyxla.device()))
        assert str(got.value) == str(cpu.value).split("\n")[0]
    good = torch.arange(4 * 4 * 2 * ratio).to(src).reshape(4, 4, 2 * ratio)[:, :, ratio:]  # offset: the ratio
    assert torch.equal(good.to(lazyxla.device()).view(dst).cpu(), good.view(dst))
