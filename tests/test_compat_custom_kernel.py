"""``torch_xla.experimental.custom_kernel`` and ``torch_xla.core.xla_builder.call_jax`` on lazyxla: flash attention
(causal, segment ids, sm_scale, ab) and its gradients against ``F.scaled_dot_product_attention`` / the explicit
masked softmax on the CPU, one program per training step, a Pallas kernel through ``make_kernel_from_pallas`` (TPU
interpret mode), grouped matmuls against a per-group loop, and ``xb.call_jax`` against ``lazyxla.call_jax``."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F
from jax.experimental import pallas as pl
from torch import nn

import lazyxla
import lazyxla.compat as compat

TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture
def tx():
    """``(custom_kernel, xla_builder)`` with the compatibility layer installed (removed again afterwards)."""
    assert compat.install()
    import torch_xla.core.xla_builder as xb
    import torch_xla.experimental.custom_kernel as ck

    yield ck, xb
    compat.uninstall()


def _qkv(b=2, h=3, lq=16, lk=16, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g) for n in (lq, lk, lk)]


def _segment_reference(q, k, v, qs, ks, sm_scale, ab):
    """torch_xla's test reference: masked_fill where the segment ids differ, then softmax."""
    s = q @ k.transpose(-2, -1)
    if ab is not None:
        s = s + ab
    s = s * sm_scale
    s = s.masked_fill(qs[:, None, :, None] != ks[:, None, None, :], torch.finfo(s.dtype).min)
    return torch.softmax(s, -1) @ v


def _run(fn, tensors, where):
    """The value and the gradients (of a fixed projection of the output) of ``fn`` on copies of ``tensors``."""
    ts = [t.detach().clone().to(where).requires_grad_(t.is_floating_point()) for t in tensors]
    leaves = [t for t in ts if t.requires_grad]
    for t in leaves:
        t.retain_grad()
    o = fn(*ts)
    w = torch.linspace(-1, 1, o.numel()).reshape(o.shape).to(where)
    (o * w).sum().backward()
    return [o.detach().cpu()] + [t.grad.cpu() for t in leaves]


def _both(fn_dev, fn_cpu, tensors, dev):
    """Values and gradients (of a fixed projection of the output) on lazyxla and on the CPU."""
    return [_run(fn_dev, tensors, dev), _run(fn_cpu, tensors, "cpu")]


@pytest.mark.parametrize("case", ["plain", "causal", "sm_scale", "ab", "causal_ab_scale", "cross_lengths_causal", "5d"])
def test_flash_attention_and_its_gradients_equal_sdpa(tx, dev, case):
    ck, _ = tx
    causal = "causal" in case
    scale = 0.3 if "scale" in case else 1.0
    lq, lk = (8, 24) if "cross" in case else (16, 16)
    q, k, v = _qkv(lq=lq, lk=lk)
    if case == "5d":
        q, k, v = (t.reshape(1, 2, 3, t.shape[-2], 8) for t in (q, k, v))
    ab = torch.randn(*q.shape[:-1], lk) if "ab" in case else None
    tensors = [q, k, v] + ([ab] if ab is not None else [])

    def ours(q, k, v, ab=None):
        return ck.flash_attention(q, k, v, causal, sm_scale=scale, ab=ab)

    def sdpa(q, k, v, ab=None):  # (qk + ab) * scale = qk * scale + ab * scale
        mask = None if ab is None else ab * scale
        if causal and mask is not None:  # SDPA takes one or the other: fold the causal mask into the bias
            keep = torch.ones(lq, lk, dtype=torch.bool).tril()
            mask, causal_flag = mask.masked_fill(~keep, float("-inf")), False
        else:
            causal_flag = causal
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal_flag, scale=scale)

    got, want = _both(ours, sdpa, tensors, dev)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("with_ab", [False, True])
def test_flash_attention_segment_ids_mask_as_torch_xla_defines_them(tx, dev, with_ab):
    ck, _ = tx
    q, k, v = _qkv(lq=12, lk=12)
    seg = torch.tensor([[0] * 5 + [1] * 7, [0] * 3 + [1] * 4 + [2] * 5], dtype=torch.int32)
    ab = torch.randn(2, 3, 12, 12) if with_ab else None
    tensors = [q, k, v, seg] + ([ab] if with_ab else [])

    def ours(q, k, v, seg, ab=None):
        return ck.flash_attention(q, k, v, False, seg, seg, 0.5, ab=ab)

    def ref(q, k, v, seg, ab=None):
        return _segment_reference(q, k, v, seg, seg, 0.5, ab)

    got, want = _both(ours, ref, tensors, dev)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)


def test_flash_attention_segment_ids_with_causal_equal_the_combined_mask(tx, dev):
    ck, _ = tx
    q, k, v = _qkv(b=1, lq=10, lk=10)
    seg = torch.tensor([[0] * 4 + [1] * 6], dtype=torch.int32)
    allowed = (seg[:, :, None] == seg[:, None, :]) & torch.ones(10, 10, dtype=torch.bool).tril()
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None], scale=1.0)
    got = ck.flash_attention(q.to(dev), k.to(dev), v.to(dev), True, seg.to(dev), seg.to(dev))
    torch.testing.assert_close(got.cpu(), want, **TOL)


class _Attn(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.qkv, self.out, self.attention = nn.Linear(16, 48), nn.Linear(16, 16), attention

    def forward(self, x):  # x: (batch, len, 16); 2 heads of 8
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return self.out(self.attention(q, k, v).transpose(1, 2).reshape(b, n, 16))


def _train_both(ref, model, x, y, dev, momentum: float) -> list[tuple]:
    """4 SGD steps of ``ref`` on the CPU and ``model`` on lazyxla; asserts equal losses and parameters and returns
    lazyxla's (compiles, executions, syncs) per step after the first."""
    results = {}
    for name, m, where in (("cpu", ref, "cpu"), ("lazyxla", model, dev)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=momentum)
        losses, counts = [], []
        for _ in range(4):
            opt.zero_grad()
            loss = F.mse_loss(m(x.to(where)), y.to(where))
            loss.backward()
            opt.step()
            lazyxla.sync()
            losses.append(loss.item())
            c = lazyxla.metrics.counters()
            counts.append((c.get("compiles", 0), c.get("executions", 0), c.get("syncs", 0)))
        results[name] = (losses, [p.detach().cpu() for p in m.parameters()], counts)
    torch.testing.assert_close(torch.tensor(results["lazyxla"][0]), torch.tensor(results["cpu"][0]), **TOL)
    for a, b in zip(results["lazyxla"][1], results["cpu"][1]):
        torch.testing.assert_close(a, b, **TOL)
    counts = results["lazyxla"][2]
    return [tuple(b[i] - a[i] for i in range(3)) for a, b in zip(counts, counts[1:])]


def test_a_training_loop_with_flash_attention_is_one_program_per_step(tx, dev):
    ck, _ = tx
    torch.manual_seed(0)
    ref = _Attn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=8**-0.5))
    model = _Attn(lambda q, k, v: ck.flash_attention(q, k, v, causal=True, sm_scale=8**-0.5))
    model.load_state_dict(ref.state_dict())
    model.to(dev)
    x, y = torch.randn(4, 12, 16), torch.randn(4, 12, 16)
    steps = _train_both(ref, model, x, y, dev, momentum=0.9)
    # after step 2 (momentum buffers appear) nothing compiles; each step syncs once and runs one program
    assert steps[1:] == [(0, 1, 1)] * 2, steps
    assert steps[0][1:] == (1, 1), steps


def _add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def add_vectors(x, y):
    return pl.pallas_call(_add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)


def _two_outputs_kernel(x_ref, o1_ref, o2_ref):
    o1_ref[...] = x_ref[...] * 2
    o2_ref[...] = x_ref[...] + 1


def two_outputs(x):
    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return pl.pallas_call(_two_outputs_kernel, out_shape=(shape, shape))(x)


def test_make_kernel_from_pallas_runs_the_kernel_interpreted_equal_to_torch(tx, dev):
    ck, _ = tx
    add = ck.make_kernel_from_pallas(add_vectors, lambda x, y: [(x.shape, x.dtype)])
    x, y = torch.arange(8, dtype=torch.int32), torch.arange(8, dtype=torch.int32) * 3
    z = add(x.to(dev), y.to(dev))
    torch.testing.assert_close(z.cpu(), x + y)
    a = torch.randn(16, 128)
    torch.testing.assert_close(add(a.to(dev), a.to(dev)).cpu(), a + a)
    both = ck.make_kernel_from_pallas(two_outputs, lambda x: [(x.shape, x.dtype)] * 2)
    o1, o2 = both(a.to(dev))
    torch.testing.assert_close(o1.cpu(), a * 2)
    torch.testing.assert_close(o2.cpu(), a + 1)
    lazyxla.metrics.reset()
    for _ in range(2):  # again: the plan and the program are reused
        add(a.to(dev), a.to(dev)).cpu()
    assert lazyxla.metrics.counters().get("compiles", 0) == 0
    wrong = ck.make_kernel_from_pallas(add_vectors, lambda x, y: [(x.shape, torch.float64)])
    with pytest.raises(ValueError, match="output_shape_dtype_fn says"):
        wrong(a.to(dev), a.to(dev))


# ---- kernels written for torch_xla's TPUs (no interpret=True) with custom_vjp rules, on the CPU --------------------


def _mul_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] * y_ref[...]


def _tpu_mul(x, y):
    """``x * y`` in (8, 128) row blocks, a grid over the rows: as torch_xla users write kernels for TPUs."""
    block = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(
        _mul_kernel,
        grid=(x.shape[0] // 8,),
        in_specs=[block, block],
        out_specs=block,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x, y)


@jax.custom_vjp
def pallas_mul(x, y):
    return _tpu_mul(x, y)


pallas_mul.defvjp(lambda x, y: (_tpu_mul(x, y), (x, y)), lambda res, g: (_tpu_mul(g, res[1]), _tpu_mul(g, res[0])))


def test_make_kernel_from_pallas_differentiates_through_the_kernel_s_custom_vjp_on_the_cpu(tx, dev):
    """The backward's kernels are traced when the VJP is taken (a call_jax node of its own), after the forward's:
    they run in the TPU interpreter too (they failed with 'Only interpret mode is supported on CPU backend')."""
    ck, _ = tx
    mul = ck.make_kernel_from_pallas(pallas_mul, lambda x, y: [(x.shape, x.dtype)])
    x, y = torch.randn(16, 128), torch.randn(16, 128)
    got, want = _both(mul, torch.mul, [x, y], dev)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)


class _Gated(nn.Module):
    def __init__(self, mul):
        super().__init__()
        self.mul, self.a, self.b, self.out = mul, nn.Linear(32, 128), nn.Linear(32, 128), nn.Linear(128, 4)

    def forward(self, x):
        return self.out(self.mul(torch.tanh(self.a(x)), self.b(x)))


def test_a_training_loop_through_a_custom_vjp_pallas_kernel_is_one_program_per_step(tx, dev, tmp_path):
    ck, _ = tx
    torch.manual_seed(0)
    ref = _Gated(torch.mul)
    model = _Gated(ck.make_kernel_from_pallas(pallas_mul, lambda x, y: [(x.shape, x.dtype)]))
    model.load_state_dict(ref.state_dict())
    model.to(dev)
    x, y = torch.randn(16, 32), torch.randn(16, 4)
    # the interpreted kernel calls back into Python: its programs skip the disk cache (no warning that jax could not
    # serialize them)
    with warnings.catch_warnings(), lazyxla.config.override(persistent_cache=True, cache_dir=str(tmp_path)):
        warnings.simplefilter("error", RuntimeWarning)
        steps = _train_both(ref, model, x, y, dev, momentum=0.0)
    assert steps == [(0, 1, 1)] * 3, steps  # after the first step nothing compiles; one sync, one program a step


def _shift_kernel(x_ref, o_ref):
    """Adds ``max(block - 1, 0)`` to each row block. ``jnp.array(0)`` is jax's default int: int64 under lazyxla's
    64-bit mode, where ``lax.select`` refuses it next to the int32 program id; int32 on a TPU, as torch_xla runs."""
    i = pl.program_id(0)
    previous = jax.lax.select(i > 0, i - 1, jnp.array(0))
    o_ref[...] = x_ref[...] + previous.astype(x_ref.dtype)


def shift_blocks(x, *, block_rows):  # block_rows: a static keyword argument, as kernels take their tiling
    block = pl.BlockSpec((block_rows, 128), lambda i: (i, 0))
    return pl.pallas_call(
        _shift_kernel,
        grid=(x.shape[0] // block_rows,),
        in_specs=[block],
        out_specs=block,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


def test_make_kernel_from_pallas_traces_kernels_with_32_bit_types(tx, dev):
    ck, _ = tx
    shift = ck.make_kernel_from_pallas(shift_blocks, lambda x: [(x.shape, x.dtype)])  # positional only, as torch_xla
    x = torch.randn(32, 128)
    offsets = torch.tensor([0.0, 0.0, 1.0, 2.0]).repeat_interleave(8)[:, None]  # blocks of 8 rows: 0, 0, 1, 2
    torch.testing.assert_close(shift(x.to(dev), block_rows=8).cpu(), x + offsets)
    ints = torch.arange(32 * 128, dtype=torch.int32).reshape(32, 128)
    offsets = torch.tensor([0, 0, 1, 2, 3, 4, 5, 6], dtype=torch.int32).repeat_interleave(4)[:, None]  # 4 rows each
    torch.testing.assert_close(shift(ints.to(dev), block_rows=4).cpu(), ints + offsets)
    # jax's TPU interpreter takes no 64-bit arrays (it failed at run time, in its callbacks): refused at the call
    with pytest.raises(TypeError, match=r"shift_blocks: .*no 64-bit arrays.*float64.*cast"):
        shift(x.double().to(dev), block_rows=8)


def _gmm_reference(lhs, rhs, sizes):
    out, start = torch.zeros(lhs.shape[0], rhs.shape[2]), 0
    for g, n in enumerate(sizes.tolist()):
        out[start : start + n] = lhs[start : start + n] @ rhs[g]
        start += n
    return out


def test_gmm_tgmm_and_GMM_equal_a_loop_over_groups(tx, dev):
    ck, _ = tx
    torch.manual_seed(0)
    lhs, rhs = torch.randn(10, 6), torch.randn(3, 6, 5)
    sizes = torch.tensor([4, 0, 5], dtype=torch.int32)  # rows 9.. belong to no group: zeros
    want = _gmm_reference(lhs, rhs, sizes)
    torch.testing.assert_close(ck.gmm(lhs.to(dev), rhs.to(dev), sizes.to(dev)).cpu(), want, **TOL)
    got_t = ck.gmm(lhs.to(dev), rhs.transpose(1, 2).contiguous().to(dev), sizes.to(dev), transpose_rhs=True)
    torch.testing.assert_close(got_t.cpu(), want, **TOL)
    grad = torch.randn(10, 5)
    want_t = torch.stack([lhs[s : s + n].t() @ grad[s : s + n] for s, n in ((0, 4), (4, 0), (4, 5))])
    torch.testing.assert_close(ck.tgmm(lhs.t().to(dev), grad.to(dev), sizes.to(dev)).cpu(), want_t, **TOL)
    a, b = lhs.to(dev).requires_grad_(), rhs.to(dev).requires_grad_()
    (ck.GMM.apply(a, b, sizes.to(dev)) * grad.to(dev)).sum().backward()
    a0, b0 = lhs.clone().requires_grad_(), rhs.clone().requires_grad_()
    (_gmm_reference(a0, b0, sizes) * grad).sum().backward()
    torch.testing.assert_close(a.grad.cpu(), a0.grad, **TOL)
    torch.testing.assert_close(b.grad.cpu(), b0.grad, **TOL)


def test_xla_builder_call_jax_equals_lazyxla_call_jax(tx, dev):
    _, xb = tx
    a, b = torch.randn(3, 3).to(dev), torch.randn(3, 3).to(dev)

    def f(a, b, *, scale):
        return {"s": a + jnp.sin(b) * scale, "p": a @ b}

    got = xb.call_jax(f, (a, b), {"scale": 2.0}, "my_name")
    want = lazyxla.call_jax(f, a, b, scale=2.0)
    for key in ("s", "p"):
        torch.testing.assert_close(got[key].cpu(), want[key].cpu(), rtol=0, atol=0)
    torch.testing.assert_close(got["s"].cpu(), a.cpu() + torch.sin(b.cpu()) * 2, **TOL)
    one = xb.call_jax(jnp.tanh, a)  # a lone argument, not in a tuple
    torch.testing.assert_close(one.cpu(), torch.tanh(a.cpu()), **TOL)
    xb._JAX_TO_XLA_COMPUTATION_CACHE.clear()  # torch_xla's tests clear it
    with pytest.raises(NotImplementedError, match="call_jax"):
        xb.create_computation("c", None, [])


def test_tpu_only_kernels_raise_naming_what_to_use(tx, dev):
    ck, _ = tx
    for name in ("trace_pallas",):  # (the kernels: tests/test_compat_paged_attention.py, _quantized_matmul.py)
        with pytest.raises(NotImplementedError, match="make_kernel_from_pallas"):
            getattr(ck, name)(torch.zeros(1).to(dev))
    with pytest.raises(ValueError, match="both q_segment_ids and kv_segment_ids"):
        ck.flash_attention(*[t.to(dev) for t in _qkv()], q_segment_ids=torch.zeros(2, 16).to(dev))
    ck.jax_import_guard()
    assert ck.convert_torch_dtype_to_jax(torch.bfloat16) == jnp.bfloat16


# ---- flash attention through jax's Pallas TPU kernel (the TPU path), run in Pallas's TPU interpreter on the CPU -----


@pytest.fixture
def tpu_kernels(tx, monkeypatch):
    """``custom_kernel`` with the TPU path switched on off a TPU (its test hook) and a count of the kernel's traces."""
    ck, _ = tx
    monkeypatch.setattr(ck, "_TPU_KERNELS_EVERYWHERE", True)
    traced = []
    real = ck._flash_kernel

    def counting(*args):
        traced.append(args)
        return real(*args)

    monkeypatch.setattr(ck, "_flash_kernel", counting)
    yield ck, traced


@pytest.mark.parametrize("case", ["plain", "causal_segments_ab", "cross_lengths_causal_5d"])
def test_flash_attention_on_the_tpu_path_runs_jax_s_kernel_equal_to_the_xla_formulation(tpu_kernels, dev, case):
    ck, traced = tpu_kernels
    lq, lk = (128, 256) if "cross" in case else (128, 128)
    q, k, v = _qkv(b=1, h=2, lq=lq, lk=lk, d=32)
    if "5d" in case:
        q, k, v = (t.reshape(1, 1, 2, t.shape[-2], 32) for t in (q, k, v))
    causal, scale = "causal" in case, 0.3
    tensors = [q, k, v]
    if "segments" in case:
        seg = torch.tensor([[0] * 50 + [1] * 78], dtype=torch.int32)
        tensors += [seg, torch.randn(1, 2, lq, lk)]

    def attention(q, k, v, seg=None, ab=None):
        return ck.flash_attention(q, k, v, causal, seg, seg, scale, ab=ab)

    kernel_run = _run(attention, tensors, dev)
    assert traced  # the kernel was traced (for the forward, and again in the backward, which recomputes it)
    n = len(traced)
    ck._TPU_KERNELS_EVERYWHERE = False  # the XLA formulation, same inputs
    xla_run = _run(attention, tensors, dev)
    assert len(traced) == n
    for a, b in zip(kernel_run, xla_run):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-5)
    if "segments" not in case:  # and SDPA's numbers (the segment and bias cases are checked against it above)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        torch.testing.assert_close(kernel_run[0], want, **TOL)


def test_flash_attention_keeps_the_xla_formulation_where_the_kernel_does_not_fit(tpu_kernels, dev):
    ck, traced = tpu_kernels
    q, k, v = _qkv(lq=16, lk=16)  # lengths not in 128-blocks
    got = ck.flash_attention(q.to(dev), k.to(dev), v.to(dev), causal=True)
    torch.testing.assert_close(got.cpu(), F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0), **TOL)
    q, k, v = _qkv(b=1, h=1, lq=128, lk=128, d=8)
    ck.flash_attention(q.to(dev).double(), k.to(dev).double(), v.to(dev).double()).cpu()  # float64: no kernel
    assert traced == []
