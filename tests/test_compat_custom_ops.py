"""torch_xla's custom ops ``torch.ops.xla.flash_attention``, ``gmm``, ``quantized_matmul_int8`` and
``quantized_matmul`` (registered when their modules are imported, as torch_xla does): on lazyxla tensors each equals
its Python function and a CPU reference; off the device the shape kernels answer as torch_xla's (``empty_like`` with
a warning; ``quantized_matmul``'s PyTorch formulation computes the value); under ``torch.compile(backend="lazyxla")``
the graph holds the op itself."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import lazyxla
import lazyxla.compat as compat

TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture
def mods():
    """torch_xla's custom_kernel and xla_quantized_matmul with the compatibility layer installed."""
    assert compat.install()
    import torch_xla.experimental.custom_kernel as ck
    import torch_xla.experimental.xla_quantized_matmul as qm

    yield ck, qm
    compat.uninstall()


def _qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, 16, 8, generator=g) for _ in range(3)]


def _int8_weight(out_dim=6, in_dim=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-128, 128, (out_dim, in_dim), generator=g, dtype=torch.int8)
    return w, torch.rand(out_dim, generator=g) / 50 + 1e-3


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_op_equals_sdpa(mods, dev, causal):
    q, k, v = _qkv()
    got = torch.ops.xla.flash_attention(q.to(dev), k.to(dev), v.to(dev), causal)
    # torch_xla's flash attention has sm_scale=1.0: SDPA's scale=1
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1.0)
    assert got.device.type == dev.type
    torch.testing.assert_close(got.cpu(), want, **TOL)
    named = torch.ops.xla.flash_attention(q.to(dev), k.to(dev), v.to(dev), casual=causal)  # torch_xla's spelling
    torch.testing.assert_close(named.cpu(), want, **TOL)


def test_gmm_op_equals_a_loop_over_groups(mods, dev):
    g = torch.Generator().manual_seed(1)
    lhs, rhs = torch.randn(9, 4, generator=g), torch.randn(3, 4, 5, generator=g)
    sizes = torch.tensor([2, 0, 7], dtype=torch.int32)
    want = torch.cat([lhs[0:2] @ rhs[0], lhs[2:9] @ rhs[2]])
    got = torch.ops.xla.gmm(lhs.to(dev), rhs.to(dev), sizes.to(dev))
    torch.testing.assert_close(got.cpu(), want, **TOL)
    got_t = torch.ops.xla.gmm(lhs.to(dev), rhs.transpose(1, 2).contiguous().to(dev), sizes.to(dev), None, None, True)
    torch.testing.assert_close(got_t.cpu(), want, **TOL)
    with pytest.raises(ValueError, match="2-d lhs and a 3-d rhs"):
        torch.ops.xla.gmm(lhs[None].to(dev), rhs.to(dev), sizes.to(dev))


@pytest.mark.parametrize("quantize_activation", [False, True])
def test_quantized_matmul_int8_op_equals_the_function(mods, dev, quantize_activation):
    ck, _ = mods
    x = torch.randn(4, 10, generator=torch.Generator().manual_seed(2))
    w, scale = _int8_weight()
    args = (x.to(dev), w.to(dev), scale.to(dev))
    got = torch.ops.xla.quantized_matmul_int8(*args, quantize_activation=quantize_activation)
    want = ck.quantized_matmul_int8(*args, quantize_activation=quantize_activation)
    assert torch.equal(got.cpu(), want.cpu())
    if not quantize_activation:  # the dequantized math
        torch.testing.assert_close(got.cpu(), x @ (w.float() * scale[:, None]).t(), **TOL)


def test_quantized_matmul_op_on_the_device_and_on_the_cpu(mods, dev):
    _, qm = mods
    x = torch.randn(3, 5, 10, generator=torch.Generator().manual_seed(3))
    w, scale = _int8_weight()
    want = x @ (w.float() * scale[:, None]).t()
    got = torch.ops.xla.quantized_matmul(x.to(dev), w.to(dev), scale.to(dev))
    torch.testing.assert_close(got.cpu(), want, **TOL)
    # off the device torch_xla's CompositeExplicitAutograd kernel is its PyTorch formulation: the value itself
    torch.testing.assert_close(torch.ops.xla.quantized_matmul(x, w, scale), want, **TOL)
    layer = qm.XlaQuantizedLinear(10, 6, is_symmetric=True)
    layer.load_quantized_weight(w, scale)
    torch.testing.assert_close(layer.to(dev)(x.to(dev)).cpu(), want, **TOL)


def test_off_the_device_the_ops_give_torch_xla_s_shapes(mods):
    q, k, v = (t.to("meta") for t in _qkv())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # meta tensors: no warning
        assert torch.ops.xla.flash_attention(q, k, v).shape == q.shape
        lhs, rhs, sizes = torch.empty(9, 4, device="meta"), torch.empty(3, 4, 5, device="meta"), torch.empty(3)
        assert torch.ops.xla.gmm(lhs, rhs, sizes.to("meta")).shape == (9, 5)
        x, w, s = torch.empty(4, 10, device="meta"), torch.empty(6, 10, device="meta"), torch.empty(6, device="meta")
        assert torch.ops.xla.quantized_matmul_int8(x, w, s).shape == (4, 6)
    with pytest.warns(UserWarning, match="should only be applied to tensors on XLA device"):
        assert torch.ops.xla.flash_attention(*_qkv()).shape == (2, 3, 16, 8)


def test_flash_attention_op_under_torch_compile(mods, dev):
    def attend(q, k, v):
        return torch.ops.xla.flash_attention(q, k, v, True) * 2

    q, k, v = _qkv(seed=4)
    compiled = torch.compile(attend, backend="lazyxla")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the graph runs op by op (the backend has no rule for xla:: ops): it says so
        got = compiled(q.to(dev), k.to(dev), v.to(dev)).cpu()
    want = 2 * F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)
    torch.testing.assert_close(got, want, **TOL)
    lazyxla.sync()
