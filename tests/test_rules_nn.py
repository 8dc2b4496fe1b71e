"""NN ops against CPU eager: convolution and pooling (rules/conv_pool.py), normalization (rules/norm.py),
softmax, activation gradients and dropout (rules/activation.py), attention (rules/attention.py), losses
(rules/loss.py), gradients."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla.lazy.tensor import unwrap
from tests.util import check, to_dev
from tests.util import normal as _r

TOL = dict(rtol=1e-4, atol=1e-5)

# ---- convolution ----

CONVS = [
    # (input shape, weight shape, kwargs, transposed)
    ((2, 3, 9), (4, 3, 3), dict(stride=2, padding=1), False),
    ((2, 4, 7, 8), (6, 2, 3, 2), dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2), False),
    ((1, 3, 6, 6), (5, 3, 3, 3), dict(padding="same", dilation=2), False),
    ((1, 2, 5, 6, 4), (3, 2, 2, 3, 2), dict(stride=(1, 2, 1), padding=1), False),
    ((2, 4, 5, 5), (4, 3, 3, 3), dict(stride=2, padding=1, output_padding=1, groups=2), True),
    ((1, 3, 4, 5), (3, 2, 2, 3), dict(stride=(2, 3), dilation=(2, 1)), True),
    ((1, 2, 5), (2, 3, 1), dict(padding=1), True),  # padding larger than the kernel's reach
    ((1, 2, 3, 4, 3), (2, 2, 2, 2, 2), dict(stride=2), True),
]


@pytest.mark.parametrize("x_shape,w_shape,kw,transposed", CONVS, ids=lambda v: str(v))
def test_convolution(x_shape, w_shape, kw, transposed):
    bias = len(x_shape) != 3  # 1-d cases without bias
    nd = len(x_shape) - 2
    fn = getattr(F, f"conv_transpose{nd}d" if transposed else f"conv{nd}d")
    out_ch = w_shape[1] * kw.get("groups", 1) if transposed else w_shape[0]
    b = _r(out_ch, seed=3) if bias else None
    check(lambda x, w, b: fn(x, w, b, **kw), _r(*x_shape), _r(*w_shape, seed=1), b, grad=True, **TOL)


def test_convolution_weight_only_grad():
    # output_mask: no input gradient asked for
    x, w = _r(1, 2, 5, 5, grad=False), _r(3, 2, 3, 3)
    check(lambda x, w: F.conv2d(x, w, padding=1), x, w, grad=True, **TOL)


# ---- pooling ----

MAX_POOLS = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(3, 2), stride=(2, 1), dilation=(1, 2)),
    dict(kernel_size=3, stride=2, ceil_mode=True),
    dict(kernel_size=2, stride=2, padding=1, ceil_mode=True),
]


@pytest.mark.parametrize("kw", MAX_POOLS, ids=str)
def test_max_pool2d(kw):
    check(lambda x: F.max_pool2d(x, **kw), _r(2, 3, 7, 8), grad=True)
    check(lambda x: F.max_pool2d(x, return_indices=True, **kw), _r(3, 7, 8, grad=False))


def test_max_pool_1d_3d_and_ties():
    check(lambda x: F.max_pool1d(x, 3, 2, 1), _r(2, 3, 9), grad=True)
    check(lambda x: F.max_pool3d(x, 2, padding=1, return_indices=True), _r(1, 2, 4, 5, 3), grad=True)
    # equal values: the gradient goes to the first maximum, as in PyTorch
    check(lambda x: F.max_pool2d(x * 0, 2), _r(1, 1, 4, 4), grad=True)


AVG_POOLS = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=(2, 3), stride=(1, 2), divisor_override=4),
]


@pytest.mark.parametrize("kw", AVG_POOLS, ids=str)
def test_avg_pool2d(kw):
    check(lambda x: F.avg_pool2d(x, **kw), _r(2, 3, 8, 7), grad=True)


def test_avg_pool_1d_3d():
    check(lambda x: F.avg_pool1d(x, 3, 2, 1, ceil_mode=True), _r(2, 3, 8), grad=True)
    check(lambda x: F.avg_pool3d(x, 2, stride=2, padding=1, count_include_pad=False), _r(1, 2, 4, 5, 3), grad=True)


@pytest.mark.parametrize("size", [1, 2, (3, 2), 5, (7, 6)])
def test_adaptive_avg_pool2d(size):
    check(lambda x: F.adaptive_avg_pool2d(x, size), _r(2, 3, 6, 5), grad=True, **TOL)


def test_adaptive_avg_pool_1d_3d():
    check(lambda x: F.adaptive_avg_pool1d(x, 4), _r(2, 3, 10), grad=True, **TOL)
    check(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 1)), _r(1, 2, 4, 5, 3), grad=True, **TOL)


@pytest.mark.parametrize("size", [1, 2, (3, 2), 4, (7, 6)])
def test_adaptive_max_pool2d(size):
    """Values, indices (flat per plane, as PyTorch's) and the gradient scattered to them; windows of unequal
    size (6 -> 4), overlapping ones (5 -> 7) and one window per plane."""
    check(lambda x: F.adaptive_max_pool2d(x, size), _r(2, 3, 6, 5), grad=True)
    check(lambda x: F.adaptive_max_pool2d(x, size, return_indices=True), _r(3, 6, 5), grad=True)


def test_adaptive_max_pool_1d_3d_and_ties():
    check(lambda x: F.adaptive_max_pool1d(x, 4, return_indices=True), _r(2, 3, 10), grad=True)
    check(lambda x: F.adaptive_max_pool3d(x, (2, 3, 1), return_indices=True), _r(1, 2, 4, 5, 3), grad=True)
    # equal values in a window (rounded, the gradient passed straight through): the first maximum's index and
    # gradient, as PyTorch's kernel
    def tied(x):
        return F.adaptive_max_pool2d(x + (x.detach().round() - x.detach()), (3, 3), return_indices=True)

    check(tied, _r(2, 2, 7, 7), grad=True)


# ---- normalization ----


@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 5), (2, 3, 2, 3, 2)])
def test_batch_norm_train_updates_running_stats(shape):
    c = shape[1]
    mean, var = torch.rand(c), torch.rand(c) + 0.5
    w, b = _r(c, seed=1), _r(c, seed=2)
    x = _r(*shape) * 3 + 1

    def fn(x, w, b, mean, var):
        y = F.batch_norm(x, mean, var, w, b, training=True, momentum=0.2, eps=1e-3)
        return y, mean, var  # the running statistics, updated in place

    check(fn, x, w, b, mean, var, grad=True, **TOL)


def test_batch_norm_eval_and_no_stats():
    c = 3
    mean, var = torch.rand(c), torch.rand(c) + 0.5
    w, b = _r(c, seed=1), _r(c, seed=2)
    check(lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, training=False), _r(2, c, 4, 4), w, b, mean, var,
          grad=True, **TOL)  # fmt: skip
    check(lambda x: F.batch_norm(x, None, None, training=True), _r(5, c, 2), grad=True, **TOL)
    check(lambda x: F.instance_norm(x), _r(2, c, 4, 4), grad=True, **TOL)


def test_batch_norm_module_buffers(dev):
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(4)
    bn_dev = torch.nn.BatchNorm2d(4).to(dev)
    x = _r(3, 4, 5, 5, grad=False)
    for _ in range(3):
        bn(x)
        bn_dev(to_dev(x))
    for name, ref in bn.state_dict().items():
        torch.testing.assert_close(bn_dev.state_dict()[name].cpu(), ref, **TOL)
    bn.eval(), bn_dev.eval()
    torch.testing.assert_close(bn_dev(to_dev(x)).cpu(), bn(x), **TOL)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_batch_norm_keeps_half_running_stats_in_their_dtype(dev, dtype):
    """Batch norm computes half-precision statistics in float32; the running statistics, updated in place, stay in
    their own dtype, as on the CPU (the value a tensor holds is of the tensor's dtype: ``tensor.set_value``)."""
    torch.manual_seed(0)
    x = _r(6, 3, 4, grad=False).to(dtype)
    stats = [torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype)]
    on_dev = [s.to(dev) for s in stats]
    F.batch_norm(x, *stats, training=True, momentum=0.3)
    F.batch_norm(to_dev(x), *on_dev, training=True, momentum=0.3)
    for got, want in zip(on_dev, stats):
        assert unwrap(got)._value[0].avals[unwrap(got)._value[1]].dtype == dtype  # before the sync too
        assert got.dtype == dtype
        torch.testing.assert_close(got.cpu(), want, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("shape,norm", [((4, 6), (6,)), ((2, 3, 8), (8,)), ((2, 3, 4), (3, 4))])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(shape, norm, affine):
    w, b = (_r(*norm, seed=1), _r(*norm, seed=2)) if affine else (None, None)
    check(lambda x, w, b: F.layer_norm(x, norm, w, b, eps=1e-3), _r(*shape) * 2 + 1, w, b, grad=True, **TOL)


def test_layer_norm_weight_without_bias():
    check(lambda x, w: F.layer_norm(x, (5,), w), _r(3, 5), _r(5, seed=1), grad=True, **TOL)


@pytest.mark.parametrize("shape,groups", [((2, 6, 5), 3), ((2, 4, 3, 3), 2), ((3, 4, 2), 4)])
def test_group_norm(shape, groups):
    c = shape[1]
    check(lambda x, w, b: F.group_norm(x, groups, w, b), _r(*shape), _r(c, seed=1), _r(c, seed=2), grad=True, **TOL)
    check(lambda x: F.group_norm(x, groups), _r(*shape), grad=True, **TOL)


def test_group_norm_empty_batch():
    check(lambda x, w: F.group_norm(x, 1, w), _r(0, 2), _r(2, seed=1), **TOL)


def test_half_precision_norms():
    tol = dict(rtol=2e-2, atol=2e-2)
    x = _r(4, 8, dtype=torch.bfloat16)
    check(lambda x: F.layer_norm(x, (8,)), x, grad=True, **tol)
    check(lambda x: F.softmax(x, -1), x, grad=True, **tol)
    check(lambda x: F.log_softmax(x, 0, dtype=torch.float32), x, grad=True, **tol)


# ---- softmax, attention ----


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax(dim):
    check(lambda x: F.softmax(x, dim), _r(3, 4, 5), grad=True, **TOL)
    check(lambda x: F.log_softmax(x, dim), _r(3, 4, 5), grad=True, **TOL)


def test_softmax_0d_and_masked_rows():
    check(lambda x: F.softmax(x, 0), _r(), grad=True)
    check(lambda x: F.log_softmax(x, -1), _r(), grad=True)
    x = torch.tensor([[1.0, float("-inf")], [float("-inf"), float("-inf")]])
    check(lambda x: torch.ops.aten._safe_softmax(x, -1), x)


@pytest.mark.parametrize("causal", [False, True])
def test_scaled_dot_product_attention(causal):
    q, k, v = _r(2, 3, 5, 4), _r(2, 3, 5, 4, seed=1), _r(2, 3, 5, 4, seed=2)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), q, k, v, grad=True, **TOL)


def test_scaled_dot_product_attention_masks():
    q, k, v = _r(2, 4, 3), _r(2, 6, 3, seed=1), _r(2, 6, 5, seed=2)
    bool_mask = torch.rand(4, 6, generator=torch.Generator().manual_seed(0)) > 0.3
    bool_mask[:, 0] = True
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, bool_mask, grad=True,
          **TOL)  # fmt: skip
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3), q, k, v,
          _r(4, 6, grad=False, seed=5), grad=True, **TOL)  # fmt: skip


def test_scaled_dot_product_attention_queries_with_nothing_to_attend_to():
    """Padding positions under a padding mask (left-padded batches in generation): their rows are all masked,
    and PyTorch gives zeros and zero gradients there. The fused rule gave NaN, which reached every logit of the
    padded sequence."""
    q, k, v = _r(2, 2, 4, 3), _r(2, 2, 4, 3, seed=1), _r(2, 2, 4, 5, seed=2)
    keep = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    keep[1, :, :, :2] = False  # the second sequence's first two positions are padding
    keep[1, :, 0] = False
    bias = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    for mask in (keep, bias):
        check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, mask, grad=True,
              **TOL)  # fmt: skip
    causal = torch.tril(torch.ones(4, 4, dtype=torch.bool)) & keep
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, causal, grad=True,
          **TOL)  # fmt: skip


@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_is_one_op_forward_and_backward(causal, dev):
    """4-d attention without dropout records PyTorch's overrideable fused op (and its backward), not the
    ~20-op math decomposition; masks, scale and rectangular causal masks match eager."""
    import lazyxla

    q, k, v = _r(2, 3, 4, 8), _r(2, 3, 6, 8, seed=1), _r(2, 3, 6, 5, seed=2)
    dq, dk, dv = (t.detach().to(dev).requires_grad_() for t in (q, k, v))
    lazyxla.metrics.reset()
    out = F.scaled_dot_product_attention(dq, dk, dv, is_causal=causal)
    assert lazyxla.metrics.counters()["ops_recorded"] == 1
    assert "FusedAttentionOverrideable" in type(out.grad_fn).__name__
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), q, k, v, grad=True, **TOL)
    bool_mask = torch.rand(4, 6, generator=torch.Generator().manual_seed(0)) > 0.3
    bool_mask[:, 0] = True
    if not causal:
        check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, bool_mask, grad=True,
              **TOL)  # fmt: skip
        bias = _r(1, 3, 4, 6, seed=4)  # a broadcast additive mask that requires grad
        check(lambda q, k, v, b: F.scaled_dot_product_attention(q, k, v, attn_mask=b, scale=0.2), q, k, v, bias,
              grad=True, **TOL)  # fmt: skip
    half = dict(rtol=2e-2, atol=2e-2)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
          *(t.detach().to(torch.bfloat16) for t in (q, k, v)), **half)  # fmt: skip


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_fully_masked_attention_rows_give_zero_like_eager(kind):
    """A query whose every key is masked (a padding row of a batch) gives 0 and zero gradients, not NaN."""
    q, k, v = _r(2, 3, 4, 8), _r(2, 3, 5, 8, seed=1), _r(2, 3, 5, 8, seed=2)
    keep = torch.rand(2, 1, 4, 5, generator=torch.Generator().manual_seed(0)) > 0.3
    keep[..., 0] = True
    keep[1, :, 2] = False  # a fully masked row
    keep[0, :, :, :] = False  # a fully masked batch entry
    mask = keep if kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, mask, grad=True, **TOL)


def test_attention_paths_pytorch_keeps(dev):
    """Dropout and grouped-query attention take PyTorch's math path (still on the device)."""
    import lazyxla

    q, k = _r(2, 4, 3, 8), _r(2, 2, 5, 8, seed=1)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), q, k, k, grad=True, **TOL)
    torch.manual_seed(0)
    out = F.scaled_dot_product_attention(*(t.detach().to(dev) for t in (q, q, q)), dropout_p=0.5)
    assert out.shape == (2, 4, 3, 8) and torch.isfinite(out.cpu()).all()
    assert not any(k.startswith("fallback.") for k in lazyxla.metrics.counters())


# ---- activations ----


@pytest.mark.parametrize(
    "fn",
    [
        F.gelu,
        lambda x: F.gelu(x, approximate="tanh"),
        F.relu,
        F.silu,
        torch.sigmoid,
        torch.tanh,
        lambda x: F.threshold(x, 0.5, -1.0),
    ],
    ids=["gelu", "gelu_tanh", "relu", "silu", "sigmoid", "tanh", "threshold"],
)
def test_activation_gradients(fn):
    check(fn, _r(4, 5) * 3, grad=True, **TOL)


# ---- losses ----


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(
    "kw", [{}, dict(label_smoothing=0.1), dict(ignore_index=2), dict(weight=True), dict(weight=True, ignore_index=1)]
)
def test_cross_entropy(reduction, kw):
    kw = dict(kw)
    weight = _r(5, grad=False).abs() + 0.1 if kw.pop("weight", False) else None
    target = torch.tensor([0, 2, 4, 1, 2, 3])
    check(
        lambda x, t, w: F.cross_entropy(x, t, weight=w, reduction=reduction, **kw),
        _r(6, 5), target, weight, grad=True, **TOL,
    )  # fmt: skip


def test_nll_loss_2d_and_1d():
    target = torch.randint(0, 4, (2, 3, 5), generator=torch.Generator().manual_seed(0))
    check(lambda x, t: F.nll_loss(F.log_softmax(x, 1), t, ignore_index=1), _r(2, 4, 3, 5), target, grad=True, **TOL)
    check(lambda x, t: F.cross_entropy(x, t, reduction="none"), _r(2, 4, 3, 5), target, grad=True, **TOL)
    check(lambda x, t: F.nll_loss(x, t), _r(5), torch.tensor(3), grad=True)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses(reduction):
    x, t = _r(4, 5), _r(4, 5, seed=1, grad=False)
    check(lambda x, t: F.mse_loss(x, t, reduction=reduction), x, t, grad=True, **TOL)
    check(lambda x, t: F.smooth_l1_loss(x, t, reduction=reduction, beta=0.5), x, t, grad=True, **TOL)
    check(lambda x, t: F.smooth_l1_loss(x, t, reduction=reduction, beta=0.0), x, t, grad=True, **TOL)
    check(lambda x, t: F.huber_loss(x, t, reduction=reduction, delta=0.7), x, t, grad=True, **TOL)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_margin_losses(reduction):
    x = _r(3, 5)
    t = torch.tensor([1, 4, 0])
    w = _r(5, seed=2, grad=False).abs()
    check(lambda x, t: F.multi_margin_loss(x, t, reduction=reduction), x, t, grad=True, **TOL)
    check(
        lambda x, t, w: F.multi_margin_loss(x, t, p=2, margin=0.5, weight=w, reduction=reduction),
        x, t, w, grad=True, **TOL,
    )  # fmt: skip
    # a target row lists classes up to its first -1; the rest of the row is ignored
    labels = torch.tensor([[2, -1, 4, 1, 3], [0, 1, -1, 0, 0], [4, 3, 2, 1, 0]])
    check(lambda x, t: F.multilabel_margin_loss(x, t, reduction=reduction), x, labels, grad=True, **TOL)
    # one sample (1-d input, 0-d target): PyTorch gives a 0-d loss
    check(lambda x, t: F.multi_margin_loss(x, t, reduction=reduction), _r(5), t[1], grad=True, **TOL)
    check(lambda x, t: F.multilabel_margin_loss(x, t, reduction=reduction), _r(5), labels[0], grad=True, **TOL)


def test_regression_losses_default_beta_delta():
    x, t = _r(4, 5), _r(4, 5, seed=1, grad=False)
    check(lambda x, t: F.smooth_l1_loss(x, t), x, t, grad=True, **TOL)
    check(lambda x, t: F.huber_loss(x, t), x, t, grad=True, **TOL)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.float32])
def test_native_dropout_backward_dtypes(dtype):
    # grad * mask * scale: a bool or integer grad gives a float result
    g = (_r(4, 5, grad=False) * 3).to(dtype)
    mask = _r(4, 5, seed=1, grad=False) > 0
    check(lambda g, m: torch.ops.aten.native_dropout_backward(g, m, 1.5), g, mask)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy(reduction):
    p = torch.sigmoid(_r(4, 5, grad=False)).requires_grad_()
    t = torch.rand(4, 5, generator=torch.Generator().manual_seed(1))
    w = _r(5, grad=False).abs()
    check(lambda p, t, w: F.binary_cross_entropy(p, t, w, reduction=reduction), p, t, w, grad=True, **TOL)
    check(lambda x, t: F.binary_cross_entropy_with_logits(x, t, reduction=reduction), _r(4, 5) * 4, t, grad=True,
          **TOL)  # fmt: skip
    check(lambda x, t, w, pw: F.binary_cross_entropy_with_logits(x, t, w, pos_weight=pw, reduction=reduction),
          _r(4, 5) * 4, t, w, _r(5, grad=False).abs(), grad=True, **TOL)  # fmt: skip


def test_dropout_identity_in_eval():
    check(lambda x: F.dropout(x, 0.5, training=False), _r(4, 5), grad=True)
    check(lambda x: F.dropout(x, 0.0, training=True), _r(4, 5), grad=True)


# ---- weight norm ----


@pytest.mark.parametrize("dim", [0, 2])
def test_weight_norm_gradients(dim):
    v = _r(4, 3, 5)
    g = _r(*[s if i == dim else 1 for i, s in enumerate(v.shape)]) + 2
    weights = torch.linspace(-1, 1, 5)  # a non-uniform gradient of w
    check(lambda v, g: torch._weight_norm(v, g, dim) * weights.to(v.device), v, g, grad=True, **TOL)


def test_weight_norm_conv_trains_on_the_device(dev):
    """wav2vec2's positional convolution: ``parametrizations.weight_norm`` over the last dim; its backward op
    (``_weight_norm_interface_backward``) has a rule, so nothing runs on the CPU."""
    torch.manual_seed(0)
    conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(4, 4, 3, padding=1), name="weight", dim=2)
    x = _r(2, 4, 6, grad=False)
    grads = []
    for m, inp in ((conv, x), (copy.deepcopy(conv).to(dev), to_dev(x))):
        m(inp).square().sum().backward()
        grads.append([p.grad for p in m.parameters()])
    for got, want in zip(*reversed(grads)):
        torch.testing.assert_close(got.cpu(), want, **TOL)
    assert not any(k.startswith("fallback.") for k in lazyxla.metrics.counters()), lazyxla.metrics.counters()
