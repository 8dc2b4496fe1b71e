"""``config.sdpa_implementation``: which implementation runs F.scaled_dot_product_attention's fused op
(rules/attention.py), the error for 'cudnn' where it cannot run, the name of the choice in the program dump,
and the cuDNN path's own code (masks, rows masked whole, the vjp backward) run on the CPU through jax's XLA
implementation in cuDNN's place. cuDNN itself runs on a GPU only: ``python -m benchmarks.attention check``
there (docs/performance.md, attention)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import lazyxla
from benchmarks import attention as cases
from lazyxla.config import FLAGS
from lazyxla.lowering.rules import attention
from tests.util import check
from tests.util import normal as _r

TOL = dict(rtol=1e-4, atol=1e-5)


def _qkv(dev, *shape):
    return [_r(*shape, seed=i).detach().to(dev).requires_grad_() for i in range(3)]


def test_auto_is_xla_on_the_cpu_and_the_dump_names_it(dev):
    assert lazyxla.config.sdpa_implementation == "auto"
    q, k, v = _qkv(dev, 2, 3, 4, 8)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    text = lazyxla.debug.stablehlo_text([out])
    assert "call @sdpa_xla(" in text and "sdpa_cudnn" not in text
    out.square().sum().backward()
    assert "call @sdpa_xla_backward(" in lazyxla.debug.stablehlo_text([q.grad])


def test_xla_forced_gives_eager_numbers():
    q, k, v = _r(2, 3, 4, 8), _r(2, 3, 6, 8, seed=1), _r(2, 3, 6, 5, seed=2)
    with lazyxla.config.override(sdpa_implementation="xla"):
        check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v, grad=True, **TOL)


def test_cudnn_off_a_gpu_raises_at_the_call(dev):
    q, k, v = _qkv(dev, 2, 3, 4, 8)
    with lazyxla.config.override(sdpa_implementation="cudnn"):
        lazyxla.metrics.reset()
        with pytest.raises(ValueError, match="'cudnn'.*'cpu' device.*CUDA GPUs only.*set it to 'auto'"):
            F.scaled_dot_product_attention(q, k, v)
        assert lazyxla.metrics.counters().get("ops_recorded", 0) == 0
        with pytest.raises(ValueError, match="'cudnn'.*math path.*dropout"):
            F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
        # a mask with is_causal: PyTorch's math path's own error, as under 'auto' (not a cuDNN one)
        mask = torch.ones(4, 4, dtype=torch.bool, device=dev)
        with pytest.raises(RuntimeError, match="attn_mask should not be set when is_causal"):
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)


def test_the_flag_is_checked_and_read_from_the_environment(monkeypatch):
    with pytest.raises(ValueError, match="'auto', 'xla', 'cudnn'"):
        lazyxla.config.sdpa_implementation = "flash"
    flag = next(f for f in FLAGS if f.name == "sdpa_implementation")
    assert flag.env == "LAZYXLA_SDPA_IMPLEMENTATION" and flag.affects_compile


# jax 0.10.2's own checks of a cuDNN flash-attention call (private: this test pins lazyxla's copy of them to
# jax's; on a CPU jax's checks act as on a GPU before Hopper, head dims up to 128)
_JAX_CUDNN = pytest.importorskip("jax._src.cudnn.fused_attention_stablehlo")


def _jax_refuses(q_shape, k_shape, v_shape, dtype, bias):
    """Whether jax's cuDNN attention refuses the call (PyTorch layout shapes), by its own check functions."""
    btnh = [jax.ShapeDtypeStruct((s[0], s[2], s[1], s[3]), dtype) for s in (q_shape, k_shape, v_shape)]
    try:
        if dtype not in (np.float16, jax.numpy.bfloat16):
            raise NotImplementedError("dtype")  # check_layout's dtype check
        if q_shape[-1] != v_shape[-1]:
            raise ValueError("jax.nn.dot_product_attention: value must have the key's shape")
        _JAX_CUDNN.check_is_flash_attention(*btnh, _JAX_CUDNN.AttentionLayout.BTNH.value, 91000, bias, True)
    except (NotImplementedError, ValueError):
        return True
    return False


@pytest.mark.parametrize("dtype", [np.float32, np.float16, jax.numpy.bfloat16])
@pytest.mark.parametrize("head", [8, 12, 64, 128, 136, 256])
@pytest.mark.parametrize("lengths", [(16, 16), (15, 16), (16, 9)])
@pytest.mark.parametrize("bias", [False, True])
def test_cudnn_constraints_match_jax(monkeypatch, dtype, head, lengths, bias):
    monkeypatch.setattr(attention, "_cuda_capability", lambda: (8, 0))
    t, s = lengths
    shapes = (2, 4, t, head), (2, 4, s, head), (2, 4, s, head)
    name = np.dtype(dtype).name
    assert (attention.cudnn_refusal(*shapes, name, bias) is not None) == _jax_refuses(*shapes, dtype, bias)
    assert attention.cudnn_refusal((2, 4, t, 64), (2, 4, s, 64), (2, 4, s, 32), name, bias) is not None


def test_cudnn_head_dims_up_to_256_from_hopper_on(monkeypatch):
    monkeypatch.setattr(attention, "_cuda_capability", lambda: (9, 0))
    shape = (2, 4, 16, 256)
    assert attention.cudnn_refusal(shape, shape, shape, "bfloat16", False) is None
    monkeypatch.setattr(attention, "_cuda_capability", lambda: (8, 6))
    assert "up to 128" in attention.cudnn_refusal(shape, shape, shape, "bfloat16", False)


def test_auto_keeps_spmd_programs_on_xla(monkeypatch):
    """On a GPU 'auto' takes cuDNN for a call it can run, except under SPMD (jax's cuDNN attention refuses a
    sequence dim laid out over devices); 'cudnn' still forces it there."""
    monkeypatch.setattr(attention, "_cuda_capability", lambda: (9, 0))
    shape = (2, 4, 16, 64)
    assert attention.choose(shape, shape, shape, "bfloat16", False) == "cudnn"
    monkeypatch.setattr(attention.devices, "spmd_enabled", lambda: True)
    assert attention.choose(shape, shape, shape, "bfloat16", False) == "xla"
    with lazyxla.config.override(sdpa_implementation="cudnn"):
        assert attention.choose(shape, shape, shape, "bfloat16", False) == "cudnn"


@pytest.fixture
def cudnn_by_xla(monkeypatch):
    """'cudnn' on the CPU, jax's XLA implementation standing in for cuDNN: lazyxla's cuDNN path (layouts, the
    bias's -inf, rows masked whole, the vjp backward) runs, and the named functions' traces are dropped after."""
    real = jax.nn.dot_product_attention

    def stand_in(*args, implementation=None, **kwargs):
        assert implementation == "cudnn"
        return real(*args, implementation="xla", **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", stand_in)
    monkeypatch.setattr(attention, "_cuda_capability", lambda: (9, 0))
    with lazyxla.config.override(sdpa_implementation="cudnn"):
        yield
    attention.sdpa_cudnn.clear_cache()
    attention.sdpa_cudnn_backward.clear_cache()


@pytest.mark.parametrize("case", ["causal", "causal_rectangular", "bool_mask", "float_bias", "rows_masked_whole"])
def test_cudnn_path_with_xla_standing_in_matches_eager(cudnn_by_xla, dev, case):
    half = dict(rtol=3e-2, atol=3e-2)
    t, s = (4, 6) if case == "causal_rectangular" else (4, 4)
    q, k, v = (_r(2, 3, n, 8, seed=i).to(torch.bfloat16) for i, n in enumerate((t, s, s)))
    keep = torch.rand(2, 1, t, s, generator=torch.Generator().manual_seed(0)) > 0.3
    keep[..., 0] = True
    keep[1, :, 2] = False  # a row masked whole
    masks = {
        "bool_mask": keep,
        "float_bias": _r(1, 3, t, s, seed=4).to(torch.bfloat16),
        "rows_masked_whole": torch.zeros(keep.shape, dtype=torch.bfloat16).masked_fill(~keep, float("-inf")),
    }
    mask = masks.get(case)
    kwargs = {"is_causal": True} if mask is None else {}

    def attend(q, k, v, m=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kwargs)

    check(attend, q, k, v, *([] if mask is None else [mask.requires_grad_(case == "float_bias")]), grad=True, **half)
    pending = attend(*(x.detach().to(dev) for x in (q, k, v)), None if mask is None else mask.detach().to(dev))
    assert "call @sdpa_cudnn(" in lazyxla.debug.stablehlo_text([pending])


def test_cudnn_on_a_gpu():
    """On a CUDA GPU: every case of ``benchmarks.attention`` under 'xla' and 'cudnn', against CPU eager."""
    if attention._cuda_capability() is None:
        pytest.skip(f"cuDNN attention needs a CUDA GPU (here: a {lazyxla.platform()!r} device)")
    assert cases.check() == 0
