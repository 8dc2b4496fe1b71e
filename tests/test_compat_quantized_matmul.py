"""torch_xla's quantized matmuls on lazyxla: ``custom_kernel.quantized_matmul_int8`` (w8a8) and the module
``torch_xla.experimental.xla_quantized_matmul`` (``quantized_matmul_xla``, ``quantized_matmul``,
``XlaQuantizedLinear``), against the dequantized math written out here in float64 PyTorch on the CPU and against
torch_xla's own PyTorch formulation (``quantized_matmul``, what its op runs on the CPU): float32 and bfloat16
activations, with and without activation quantization, per channel and blockwise, symmetric and asymmetric, odd
shapes. Each call is one program, nothing falls back to the CPU (strict mode)."""

from __future__ import annotations

import pytest
import torch

import lazyxla
import lazyxla.compat as compat

TOLS = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}


@pytest.fixture
def tx():
    """``(custom_kernel, xla_quantized_matmul)`` with the compatibility layer installed, in strict mode."""
    assert compat.install()
    import torch_xla.experimental.custom_kernel as ck
    import torch_xla.experimental.xla_quantized_matmul as xq

    with lazyxla.config.override(strict=True):
        yield ck, xq
    compat.uninstall()


def _quantize_activation(x):
    """torch_xla's activation quantization, by its definition: symmetric int8 per row, computed in x's dtype,
    saturating as XLA's conversion does (in bfloat16 a row's largest value can come to 127.5, rounded to 128)."""
    scale = x.abs().amax(-1, keepdim=True) / 127
    return torch.round(x / scale).clamp(-128, 127).to(torch.int8), scale


def _reference(x, w, scaler, zero_point=None, block_size=-1, quantize_activation=False):
    """The dequantized math in float64: ``x @ (w * scaler - zero_point).T`` (per channel), per block of input
    channels when blockwise; with activation quantization, x is its int8 rows times their scales."""
    if quantize_activation:
        x_int, scale = _quantize_activation(x)
        x = x_int.double() * scale.double()
    x = x.double()
    if block_size == -1:
        w_real = w.double() * scaler.double()[:, None]  # [out, in]
        if zero_point is not None:
            w_real = w_real - zero_point.double()[:, None]
    else:
        w_real = w.double() * scaler.double()[:, None, :]  # [in / block, block, out]
        if zero_point is not None:
            w_real = w_real - zero_point.double()[:, None, :]
        w_real = w_real.reshape(-1, w.shape[-1]).t()
    return x @ w_real.t()


def _per_channel_weight(out_dim, in_dim, symmetric=True, seed=0):
    """A float weight quantized per output channel as torch_xla's tests do (torch.ao's per-channel qparams): int8
    ``w``, float32 ``scaler`` and, asymmetric, ``zero_point`` in torch_xla's form (the integer zero point times the
    scale), so that ``w_fp ~ w * scaler - zero_point``."""
    w_fp = torch.randn(out_dim, in_dim, generator=torch.Generator().manual_seed(seed))
    lo, hi = w_fp.amin(1).clamp(max=0), w_fp.amax(1).clamp(min=0)
    if symmetric:
        scaler, zp = torch.maximum(-lo, hi) / 127.5, torch.zeros(out_dim)
    else:
        scaler = (hi - lo) / 255
        zp = -128 - torch.round(lo / scaler)
    w = (torch.round(w_fp / scaler[:, None]) + zp[:, None]).clamp(-128, 127).to(torch.int8)
    return w_fp, w, scaler, None if symmetric else zp * scaler


def _one_program(fn):
    """``fn()``'s result on the CPU, checking it ran as one compiled program."""
    lazyxla.sync()
    lazyxla.metrics.reset()
    out = fn().cpu()
    counts = lazyxla.metrics.counters()
    assert (counts["compiles"], counts["executions"]) == (1, 1), counts
    return out


SHAPES = [(5, 7, 3), (16, 33, 9), ((2, 3), 20, 11)]  # (batch dims, in, out): odd sizes, leading batch dims


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("quantize_activation", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_quantized_matmul_int8_equals_the_dequantized_math(tx, dev, dtype, quantize_activation, shape):
    ck, xq = tx
    batch, n_in, n_out = shape
    batch = batch if isinstance(batch, tuple) else (batch,)
    x = torch.randn(*batch, n_in, generator=torch.Generator().manual_seed(1)).to(dtype)
    _, w, scaler, _ = _per_channel_weight(n_out, n_in)
    got = _one_program(
        lambda: ck.quantized_matmul_int8(x.to(dev), w.to(dev), scaler.to(dev), None, None, quantize_activation)
    )
    assert got.dtype == dtype and got.shape == (*batch, n_out)
    want = _reference(x, w, scaler, quantize_activation=quantize_activation)
    torch.testing.assert_close(got.double(), want, **TOLS[dtype])
    # and torch_xla's fallback formula, run in PyTorch on the CPU (its quantized_matmul, cast to x's dtype)
    torch_xla_cpu = xq.quantized_matmul(x, w, scaler, quantize_activation=quantize_activation).to(dtype)
    torch.testing.assert_close(got, torch_xla_cpu, **TOLS[dtype])


def test_quantized_matmul_int8_is_close_to_the_float_matmul_as_torch_xla_tests_it(tx, dev):
    ck, _ = tx
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(2))
    w_fp, w, scaler, _ = _per_channel_weight(128, 256)
    expected = x @ w_fp.t()
    for quantize_activation in (False, True):
        got = ck.quantized_matmul_int8(x.to(dev), w.to(dev), scaler.to(dev), quantize_activation=quantize_activation)
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=1.5)  # test_pallas.py's check
        assert ((got.cpu() - expected).norm() / expected.norm()) < 2e-2


def test_quantized_matmul_int8_refuses_what_torch_xla_s_kernel_refuses(tx, dev):
    ck, _ = tx
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(5)).to(dev)
    w, s = torch.zeros(3, 8, dtype=torch.int8).to(dev), torch.ones(3).to(dev)
    with pytest.raises(NotImplementedError, match="quantized_matmul_xla"):
        ck.quantized_matmul_int8(x, w, s, zero_point=torch.zeros(3).to(dev))
    with pytest.raises(ValueError, match="torch.int8"):
        ck.quantized_matmul_int8(x, w.float(), s)
    with pytest.raises(ValueError, match=r"\[output_dim, input_dim\] = \[3, 8\]"):
        ck.quantized_matmul_int8(x, torch.zeros(3, 5, dtype=torch.int8).to(dev), s)
    # torch_xla's block sizes are its kernel's tiling: accepted, same numbers
    a = ck.quantized_matmul_int8(x, w, s, batch_block_size=128, out_block_size=128, in_block_size=128)
    torch.testing.assert_close(a.cpu(), torch.zeros(4, 3))


def test_a_row_of_zeros_gives_zeros_with_activation_quantization(tx, dev):
    """A padding row (all zeros: scale 0, 0/0 quantized to 0) gives zeros, not NaN, as on torch_xla's TPU."""
    ck, _ = tx
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(4))
    x[1] = 0
    _, w, scaler, _ = _per_channel_weight(4, 8)
    got = ck.quantized_matmul_int8(x.to(dev), w.to(dev), scaler.to(dev), quantize_activation=True).cpu()
    assert got[1].eq(0).all()
    want = _reference(x[[0, 2]], w, scaler, quantize_activation=True)
    torch.testing.assert_close(got[[0, 2]].double(), want, **TOLS[torch.float32])  # a float32 result


def _blockwise_weight(n_in, n_out, block, dtype, symmetric, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-128, 128, (n_in // block, block, n_out), generator=g, dtype=torch.int8)
    scaler = (torch.rand(n_in // block, n_out, generator=g) * 0.02).to(dtype)
    zero_point = None if symmetric else (torch.randn(n_in // block, n_out, generator=g) * 0.01).to(dtype)
    return w, scaler, zero_point


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "case", ["per_channel", "per_channel_asymmetric", "per_channel_activation", "blockwise", "blockwise_asymmetric"]
)
def test_quantized_matmul_xla_equals_torch_xla_s_math_on_the_cpu(tx, dev, dtype, case):
    _, xq = tx
    x = torch.randn(3, 6, 24, generator=torch.Generator().manual_seed(3)).to(dtype)
    quantize_activation = "activation" in case
    block_size = 8 if "blockwise" in case else -1
    if block_size == -1:
        _, w, scaler, zero_point = _per_channel_weight(13, 24, symmetric="asymmetric" not in case)
    else:
        w, scaler, zero_point = _blockwise_weight(24, 13, block_size, dtype, symmetric="asymmetric" not in case)
    args = (w, scaler, zero_point, block_size, False, quantize_activation)
    got = _one_program(
        lambda: xq.quantized_matmul_xla(x.to(dev), *(a.to(dev) if torch.is_tensor(a) else a for a in args))
    )
    if quantize_activation and dtype == torch.bfloat16:  # this data has a row's largest value at 127.5 -> 128
        assert (torch.round(x / (x.abs().amax(-1, keepdim=True) / 127)) == 128).any()  # saturated to 127, not wrapped
    cpu = xq.quantized_matmul(x, *args)  # torch_xla's formulation, in PyTorch, on the CPU
    assert got.dtype == cpu.dtype  # torch's promotion of the operands (float32 scaler and bfloat16 x: float32)
    torch.testing.assert_close(got, cpu, **TOLS[dtype])
    want = _reference(x, w, scaler, zero_point, block_size, quantize_activation)
    torch.testing.assert_close(got.double(), want, **TOLS[dtype])
    assert xq.quantized_matmul_xla(x, *args).equal(cpu)  # CPU tensors: torch_xla's CPU formulation itself


def test_int4_weights_and_gradients_through_quantized_matmul_xla(tx, dev):
    _, xq = tx
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 12, generator=g)
    w = torch.randint(-8, 8, (7, 12), generator=g, dtype=torch.int8)  # int4 values in an int8 container
    scaler = torch.rand(7, generator=g) * 0.1
    got = xq.quantized_matmul_xla(x.to(dev), w.to(dev), scaler.to(dev), int4_weight=True)
    torch.testing.assert_close(got.cpu().double(), _reference(x, w, scaler), **TOLS[torch.float32])
    xd = x.to(dev).requires_grad_()
    (xq.quantized_matmul_xla(xd, w.to(dev), scaler.to(dev)) ** 2).sum().backward()
    xc = x.clone().requires_grad_()
    (xq.quantized_matmul(xc, w, scaler) ** 2).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, **TOLS[torch.float32])


@pytest.mark.parametrize("quantize_activation", [False, True])
def test_xla_quantized_linear_on_lazyxla_equals_it_on_the_cpu(tx, dev, quantize_activation):
    """torch_xla's test_q_linear_module_per_channel: the layer on the CPU and on the device agree."""
    _, xq = tx
    w_fp, w, scaler, _ = _per_channel_weight(8, 5, seed=5)
    layer = xq.XlaQuantizedLinear(5, 8, is_symmetric=True, quantize_activation=quantize_activation)
    layer.load_quantized_weight(w, scaler)
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        out_cpu = layer(x)
        out_dev = layer.to(dev)(x.to(dev)).cpu()
    assert ((out_cpu - x @ w_fp.t()).norm() / (x @ w_fp.t()).norm()) < 2e-2  # close to the float layer
    torch.testing.assert_close(out_dev, out_cpu, **TOLS[torch.float32])
    blockwise = xq.XlaQuantizedLinear(16, 4, is_symmetric=False, block_size=8)
    w_b, s_b, zp_b = _blockwise_weight(16, 4, 8, torch.float32, symmetric=False)
    blockwise.load_quantized_weight(w_b, s_b, zp_b)
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(blockwise.to(dev)(x.to(dev)).cpu(), blockwise.cpu()(x), **TOLS[torch.float32])
    with pytest.raises(ValueError, match="block_size"):
        blockwise.load_quantized_weight(w, scaler)
