"""torch.autocast("lazyxla"): PyTorch's CUDA autocast lists at AutocastPrivateUse1 (lazyxla/frontend/autocast.py)."""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F

import lazyxla
from lazyxla.frontend import autocast
from tests.models import GPT

LOW = (torch.bfloat16, torch.float16)
_BF16_DOT = re.compile(
    r"stablehlo\.dot_general [^\n]*: \(tensor<[^>]*xbf16>, tensor<[^>]*xbf16>\) -> tensor<[^>]*xbf16>"
)
_F32_DOT = re.compile(r"stablehlo\.dot_general [^\n]*: \(tensor<([^>]*)xf32>, tensor<[^>]*xf32>\)")


def _rand(*shape, device="lazyxla", dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)


# ---- registration ----


def test_lists_cover_exactly_the_ops_pytorch_autocasts_on_cuda():
    """The same ops as PyTorch's own AutocastCUDA registrations in the installed torch, none more, none less."""
    ours = set(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastPrivateUse1"))
    cuda = set(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA"))
    assert ours == cuda, (sorted(ours - cuda), sorted(cuda - ours))
    assert set(autocast.kernels()) == ours


def test_the_tables_name_every_op_the_pinned_torch_autocasts():
    """An op the tables do not name would run in float32 (``unlisted``): none may, on the torch we pin."""
    assert autocast.unlisted() == ()


def test_table_entries_the_installed_torch_does_not_autocast_are_only_known_version_or_build_ones():
    """Entries skipped for the installed torch: ops added by torch 2.14, or registered by CUDA builds only."""
    cuda = {r.removeprefix("aten::") for r in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA")}
    skipped = autocast._listed() - cuda
    assert skipped <= {"linalg_matrix_sqrth", "_cudnn_rnn"}, sorted(skipped)


def test_an_op_a_newer_torch_autocasts_runs_in_float32(monkeypatch):
    """'Follow the installed torch': an op its CUDA table has and lazyxla's tables lack gets the fp32 kernel."""
    monkeypatch.setattr(autocast, "_cuda_autocast_ops", lambda: frozenset({"mm", "sin"}))
    assert autocast.unlisted() == ("sin",)
    assert autocast.policy("sin") == "fp32"
    table = autocast.kernels()
    assert set(table) == {"aten::mm", "aten::sin"}
    x = torch.randn(4, device="lazyxla").bfloat16()
    with torch.autocast("lazyxla", dtype=torch.bfloat16):
        out = table["aten::sin"](x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), x.cpu().float().sin())


def test_policy():
    assert autocast.policy("aten::matmul") == "lower_precision_fp"
    assert autocast.policy("softmax.int") == "fp32_set_opt_dtype"
    assert autocast.policy("norm.Scalar") == "fp32_append_dtype"
    assert autocast.policy("layer_norm") == "fp32"
    assert autocast.policy("addcmul") == "promote"
    assert autocast.policy("binary_cross_entropy") == "banned"
    assert autocast.policy("relu") is None


# ---- what each policy does ----


@pytest.mark.parametrize("dtype", LOW)
def test_matmul_linear_conv_run_in_the_autocast_dtype(dtype):
    x, w, b = _rand(8, 16), _rand(4, 16, seed=1), _rand(4, seed=2)
    img, k = _rand(1, 2, 6, 6, seed=3), _rand(3, 2, 3, 3, seed=4)
    with torch.autocast("lazyxla", dtype=dtype):
        assert torch.get_autocast_dtype("lazyxla") == dtype
        y1, y2, y3 = x @ w.t(), F.linear(x, w, b), F.conv2d(img, k)
    assert (y1.dtype, y2.dtype, y3.dtype) == (dtype, dtype, dtype)
    short = {torch.bfloat16: "bf16", torch.float16: "f16"}[dtype]
    hlo = lazyxla.debug.stablehlo_text([y1, y2, y3])
    dots = re.findall(r"stablehlo\.dot_general [^\n]*", hlo)
    assert len(dots) == 2 and all(f"x{short}>, tensor<" in d and d.endswith(f"x{short}>") for d in dots), dots
    (conv,) = re.findall(r"stablehlo\.convolution[^\n]*", hlo)
    assert f": (tensor<1x2x6x6x{short}>, tensor<3x2x3x3x{short}>) -> tensor<1x3x4x4x{short}>" in conv, conv
    ref = (x.cpu().to(dtype).float() @ w.cpu().to(dtype).float().t()).to(dtype)
    torch.testing.assert_close(y1.cpu(), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", LOW)
def test_fp32_ops_return_float32(dtype):
    x = _rand(4, 8)
    t = torch.randint(0, 8, (4,)).to("lazyxla")
    with torch.autocast("lazyxla", dtype=dtype):
        h = x @ _rand(8, 8, seed=1)  # lower precision
        assert h.dtype == dtype
        outs = {
            "layer_norm": F.layer_norm(h, (8,)),
            "softmax": h.softmax(-1),
            "log_softmax": h.log_softmax(-1),
            "sum": h.sum(),
            "sum_dim": h.sum(1),
            "mse_loss": F.mse_loss(h, x),
            "exp": h.exp(),
            "norm": h.norm(),
            "cross_entropy": F.cross_entropy(h, t),
            "relu (unlisted)": h.relu(),
            "explicit dtype kept": h.sum(dtype=dtype),
        }
    want = {k: torch.float32 for k in outs} | {"relu (unlisted)": dtype, "explicit dtype kept": dtype}
    assert {k: v.dtype for k, v in outs.items()} == want
    # bf16-level tolerance: XLA may skip rounding h to 16 bits where its consumer converts it back to float32
    # (xla_allow_excess_precision), so layer_norm can see the unrounded product
    ref = F.layer_norm(h.cpu().float(), (8,))
    torch.testing.assert_close(outs["layer_norm"].cpu(), ref, rtol=2e-2, atol=2e-2)


def test_promote_runs_in_the_widest_type():
    a, b = _rand(4, 4), _rand(4, 4, seed=1).bfloat16()
    with torch.autocast("lazyxla", dtype=torch.bfloat16):
        assert torch.addcmul(b, a, b).dtype == torch.float32
        assert torch.addcmul(b, b, b).dtype == torch.bfloat16
        assert torch.dot(a[0], b[0]).dtype == torch.float32  # mixed dtypes: plain PyTorch would refuse
        assert a.scatter_add(0, torch.zeros(4, 4, dtype=torch.long, device="lazyxla"), b).dtype == torch.float32


def test_nested_disabled_region_and_exit_restore_float32():
    x = _rand(4, 4)
    with torch.autocast("lazyxla", dtype=torch.bfloat16):
        assert (x @ x).dtype == torch.bfloat16
        with torch.autocast("lazyxla", enabled=False):
            assert not torch.is_autocast_enabled("lazyxla")
            assert (x @ x).dtype == torch.float32
        assert (x @ x).dtype == torch.bfloat16
    assert (x @ x).dtype == torch.float32


def test_only_floating_lazyxla_tensors_are_cast():
    with torch.autocast("lazyxla", dtype=torch.bfloat16):
        cpu = torch.ones(3, 3)
        assert (cpu @ cpu).dtype == torch.float32  # autocast("lazyxla") leaves CPU tensors alone
        i = torch.ones(3, 3, dtype=torch.long, device="lazyxla")
        assert (i @ i).dtype == torch.long
        d = torch.ones(3, 3, dtype=torch.float64, device="lazyxla")
        assert (d @ d).dtype == torch.float64  # float64 is never cast (PyTorch's is_eligible)


def test_binary_cross_entropy_is_refused_like_on_cuda():
    p = _rand(4).sigmoid()
    with torch.autocast("lazyxla", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
            F.binary_cross_entropy(p, p)
        assert F.binary_cross_entropy_with_logits(p, p).dtype == torch.float32


def test_sdpa_takes_the_fused_kernel_with_lower_precision_inputs():
    q, k, v = _rand(2, 2, 8, 4), _rand(2, 2, 8, 4, seed=1), _rand(2, 2, 8, 4, seed=2)
    with torch.autocast("lazyxla", dtype=torch.bfloat16):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.dtype == torch.bfloat16
    ir = lazyxla.debug.ir_text([out])
    (fused,) = [line for line in ir.splitlines() if "_scaled_dot_product_fused_attention_overrideable" in line]
    assert fused.count("torch.bfloat16") == 1  # output 0; its inputs are the three bf16 casts
    assert ir.count("aten._to_copy.default") == 3
    ref = F.scaled_dot_product_attention(*(t.cpu().bfloat16().float() for t in (q, k, v)), is_causal=True)
    torch.testing.assert_close(out.cpu().float(), ref, rtol=2e-2, atol=2e-2)


# ---- the casts are ordinary differentiable tensors ----


def test_casts_stay_functional_tensors():
    """``Tensor.to(dtype)`` on lazyxla returns a functional tensor like any op (PyTorch's functionalization of
    ``_to_copy`` would hand back the bare inner tensor), so in-place ops on a cast work."""
    x = _rand(8)
    b = x.bfloat16()
    assert torch._is_functional_tensor(b)
    b.masked_fill_(x > 0, 0.0)
    assert torch.equal(b.cpu(), x.cpu().bfloat16().masked_fill(x.cpu() > 0, 0.0))
    logits, t = _rand(4, 8).bfloat16(), torch.tensor([1, 2, 3, 4]).to("lazyxla")
    loss = F.cross_entropy(logits, t, label_smoothing=0.1)  # masked_fill_ on a bf16 tensor inside
    ref = F.cross_entropy(logits.cpu(), t.cpu(), label_smoothing=0.1)
    torch.testing.assert_close(loss.cpu(), ref, rtol=2e-2, atol=2e-2)


def test_gradients_reach_float32_parameters_in_float32():
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    model = copy.deepcopy(cpu_model).to("lazyxla")
    x = _rand(8, 16, device="cpu")
    grads = []
    for m, dev in ((cpu_model, "cpu"), (model, "lazyxla")):
        with torch.autocast(dev, dtype=torch.bfloat16):
            out = m(x.to(dev))
            loss = F.mse_loss(out, torch.zeros_like(out))
        assert out.dtype == torch.bfloat16 and loss.dtype == torch.float32
        loss.backward()
        assert all(p.grad.dtype == torch.float32 for p in m.parameters())
        grads.append([p.grad.cpu() for p in m.parameters()])
    for g, ref in zip(grads[1], grads[0]):
        assert (g - ref).norm() / ref.norm() < 2e-2


# ---- the same result dtypes as CPU autocast where PyTorch's CPU and CUDA lists agree ----

# The CPU lists differ from CUDA's: on CPU, addmv/addr/mv are not lower precision, the float32 list is applied
# only to some losses (so exp, softmax, layer_norm, sum of a bf16 tensor stay bf16 there), cat/stack/index_copy
# promote, and dot/scatter_add/index_put/tensordot are not promoted (mixed dtypes raise). lazyxla follows CUDA.
AGREE = {
    "mm": lambda a, b, t: torch.mm(a, b),
    "matmul": lambda a, b, t: a @ b,
    "bmm": lambda a, b, t: torch.bmm(a[None], b[None]),
    "addmm": lambda a, b, t: torch.addmm(a, a, b),
    "baddbmm": lambda a, b, t: torch.baddbmm(a[None], a[None], b[None]),
    "linear": lambda a, b, t: F.linear(a, b, a[0]),
    "einsum": lambda a, b, t: torch.einsum("ij,jk->ik", a, b),
    "linalg_vecdot": lambda a, b, t: torch.linalg.vecdot(a, b),
    "conv1d": lambda a, b, t: F.conv1d(a[None], b[:, :, None]),
    "conv2d": lambda a, b, t: F.conv2d(a[None, None], b[None, None, :3, :3]),
    "prelu": lambda a, b, t: F.prelu(a, b[0, :1]),
    "sdpa": lambda a, b, t: F.scaled_dot_product_attention(a[None, None], b[None, None], a[None, None]),
    "mse_loss": lambda a, b, t: F.mse_loss(a, b),
    "l1_loss": lambda a, b, t: F.l1_loss(a, b),
    "smooth_l1_loss": lambda a, b, t: F.smooth_l1_loss(a, b),
    "huber_loss": lambda a, b, t: F.huber_loss(a, b),
    "nll_loss": lambda a, b, t: F.nll_loss(a, t),
    "cross_entropy": lambda a, b, t: F.cross_entropy(a, t),
    "kl_div": lambda a, b, t: F.kl_div(a, b.abs(), reduction="batchmean"),
    "bce_with_logits": lambda a, b, t: F.binary_cross_entropy_with_logits(a, b.sigmoid()),
    "cdist": lambda a, b, t: torch.cdist(a, b),
    "prod": lambda a, b, t: a.prod(),
    "relu": lambda a, b, t: a.relu(),
    "gelu": lambda a, b, t: F.gelu(a),
    "add": lambda a, b, t: a + b,
    "cat": lambda a, b, t: torch.cat([a, b]),
    "mean": lambda a, b, t: a.mean(),
}


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)])
def test_result_dtypes_match_cpu_autocast_where_the_lists_agree(dtypes):
    base_a, base_b = _rand(8, 8, device="cpu"), _rand(8, 8, device="cpu", seed=1)
    t = torch.randint(0, 8, (8,), generator=torch.Generator().manual_seed(2))
    got = {}
    for dev in ("cpu", "lazyxla"):
        a, b = base_a.to(dev, dtypes[0]), base_b.to(dev, dtypes[1])
        with torch.autocast(dev, dtype=torch.bfloat16):
            got[dev] = {name: fn(a, b, t.to(dev)).dtype for name, fn in AGREE.items()}
    assert got["lazyxla"] == got["cpu"]


def test_where_the_lists_differ_lazyxla_follows_cuda():
    x = _rand(4, 8).bfloat16()
    outs = {}
    for dev in ("cpu", "lazyxla"):
        with torch.autocast(dev, dtype=torch.bfloat16):
            y = x.to(dev)
            outs[dev] = (y.softmax(-1).dtype, F.layer_norm(y, (8,)).dtype, y.exp().dtype, y.sum().dtype)
    assert outs["cpu"] == (torch.bfloat16,) * 4
    assert outs["lazyxla"] == (torch.float32,) * 4


# ---- a training step ----


def _train_gpt(model, device: str, autocast_on: bool, steps: int = 3):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 64, (2, 16), generator=g), torch.randint(0, 64, (2, 16), generator=g)
    model = model.to(device)
    x, y = x.to(device), y.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses, compiles, hlo, out_dtype = [], [], None, None
    for step in range(steps):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast_on):
            out = model(x)
            loss = F.cross_entropy(out.flatten(0, 1), y.flatten(), label_smoothing=0.1)
        out_dtype = out.dtype
        loss.backward()
        assert all(p.grad.dtype == torch.float32 for p in model.parameters())
        opt.step()
        opt.zero_grad()
        if device == "lazyxla":
            if step == 0:
                hlo = lazyxla.debug.stablehlo_text([loss, *model.parameters()])
            lazyxla.sync()
            compiles.append(lazyxla.metrics.counters()["compiles"])
        losses.append(loss.detach().cpu())
    params = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return torch.stack(losses), params, compiles, hlo, out_dtype


def _normwise(a: dict, b: dict) -> float:
    num = sum(float((a[k] - b[k]).norm()) ** 2 for k in b) ** 0.5
    return num / sum(float(b[k].norm()) ** 2 for k in b) ** 0.5


def test_gpt_training_step_matches_cpu_autocast():
    """3 SGD steps of the test GPT, forward and loss under autocast bf16, on lazyxla and on CPU from the same
    weights.

    Measured (torch 2.13, jax 0.10.2 on the CPU; label smoothing 0.1): losses lazyxla 4.76699, 4.07031, 3.42246,
    CPU autocast 4.76417, 4.07167, 3.42043 (at most 6e-4 apart, relative); float32 4.76391, 4.06985, 3.42097.
    Final parameters 3.0e-4 apart (normwise) from CPU autocast's. CUDA autocast (an H100, torch 2.11) gives
    4.76650, 4.07322, 3.42553 and is 3.1e-4 from lazyxla's parameters. bf16 rounding differs between any two
    implementations about as much as bf16 differs from float32 (lazyxla float32 is also 3e-4 from CPU autocast),
    so the comparison with CPU bounds the noise, and what shows autocast is on is the bf16 program, the bf16
    logits and a loss that moved away from float32's (3e-3 here, against 1e-7 between float32 runs).
    """
    torch.manual_seed(0)
    model = GPT()
    ref_losses, ref_params, _, _, ref_dtype = _train_gpt(copy.deepcopy(model), "cpu", True)
    fp32_losses, _, _, _, _ = _train_gpt(copy.deepcopy(model), "cpu", False)
    losses, params, compiles, hlo, out_dtype = _train_gpt(model, "lazyxla", True)

    assert out_dtype == ref_dtype == torch.bfloat16
    torch.testing.assert_close(losses, ref_losses, rtol=1e-2, atol=0)
    assert _normwise(params, ref_params) < 2e-3
    assert (losses[0] - fp32_losses[0]).abs() > 5e-4  # the forward ran in bf16 (float32 runs agree to 1e-6)

    # every Linear's forward and both its backward matmuls are bf16 dot_generals; only attention (whose
    # lowering accumulates in float32 on purpose) has float32 ones, all 4-d
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert len(_BF16_DOT.findall(hlo)) == 3 * linears, _BF16_DOT.findall(hlo)
    assert all(shape.count("x") == 3 for shape in _F32_DOT.findall(hlo)), _F32_DOT.findall(hlo)

    assert compiles[2] == compiles[1], compiles  # step 3 reuses step 2's program
