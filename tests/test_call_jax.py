"""``lazyxla.call_jax`` / ``jax_function`` / ``to_jax`` / ``from_jax``: JAX functions and Pallas kernels (interpret
mode) inside PyTorch models, one node of the step's program, trained against the same math in PyTorch on the CPU."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from jax.experimental import pallas as pl
from torch import nn

import lazyxla
from tests import call_jax_workers as W
from tests.test_export import _consume

TOL = {"rtol": 1e-5, "atol": 1e-5}


# ---- the JAX side: a jnp function, Pallas kernels (interpret mode) with custom_vjp rules ------------------------


def jnp_block(x, w1, w2):
    """RMS-normalized tanh-GELU MLP, in jax.numpy."""
    h = jax.nn.gelu(x @ w1, approximate=True)
    h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6)
    return h @ w2


def torch_block(x, w1, w2):
    h = F.gelu(x @ w1, approximate="tanh")
    h = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + 1e-6)
    return h @ w2


def _add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


@jax.custom_vjp
def pallas_add(x, y):
    return pl.pallas_call(_add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x, y)


pallas_add.defvjp(lambda x, y: (pallas_add(x, y), None), lambda _, g: (g, g))

BLOCK = 8


def _matmul_kernel(x_ref, y_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)


def _tiled_matmul(x, y):
    """A tiled matmul: a (m/8, n/8, k/8) grid of 8x8 blocks, accumulating over k."""
    (m, k), (_, n) = x.shape, y.shape
    return pl.pallas_call(
        _matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        grid=(m // BLOCK, n // BLOCK, k // BLOCK),
        in_specs=[
            pl.BlockSpec((BLOCK, BLOCK), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((BLOCK, BLOCK), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((BLOCK, BLOCK), lambda i, j, kk: (i, j)),
        interpret=True,
    )(x, y)


@jax.custom_vjp
def pallas_matmul(x, y):
    return _tiled_matmul(x, y)


pallas_matmul.defvjp(
    lambda x, y: (_tiled_matmul(x, y), (x, y)),
    lambda res, g: (_tiled_matmul(g, res[1].T), _tiled_matmul(res[0].T, g)),
)


def pallas_block(x, w1, w2, b):
    return pallas_matmul(jnp.tanh(pallas_add(pallas_matmul(x, w1), b)), w2)


def torch_pallas_block(x, w1, w2, b):
    return torch.tanh(x @ w1 + b) @ w2


class Block(nn.Module):
    """``jax_fn`` on a lazyxla device (through call_jax), ``torch_fn`` on the CPU: the same math."""

    def __init__(self, jax_fn, torch_fn, bias=False):
        super().__init__()
        self.jax_fn, self.torch_fn = jax_fn, torch_fn
        self.w1 = nn.Parameter(torch.randn(16, 32) / 4)
        self.w2 = nn.Parameter(torch.randn(32, 8) / 6)
        self.b = nn.Parameter(torch.randn(16, 32) / 10) if bias else None

    def forward(self, x):
        args = (x, self.w1, self.w2) + ((self.b,) if self.b is not None else ())
        if x.device.type == "cpu":
            return self.torch_fn(*args)
        return lazyxla.call_jax(self.jax_fn, *args)


def _train(model, device, steps=4):
    """SGD with momentum on a fixed regression batch: losses, then the parameters after the last step."""
    torch.manual_seed(1)
    x, target = torch.randn(16, 16).to(device), torch.randn(16, 8).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses, compiles, syncs = [], [], []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        lazyxla.sync()
        losses.append(loss.item())
        counters = lazyxla.metrics.counters()
        compiles.append(counters.get("compiles", 0))
        syncs.append((counters.get("syncs", 0), counters.get("executions", 0)))
    return losses, [p.detach().cpu() for p in model.parameters()], compiles, syncs


@pytest.mark.parametrize(
    "jax_fn,torch_fn,bias",
    [(jnp_block, torch_block, False), (pallas_block, torch_pallas_block, True)],
    ids=["jnp", "pallas"],
)
def test_a_jax_module_trains_as_the_same_math_in_pytorch(dev, jax_fn, torch_fn, bias):
    torch.manual_seed(0)
    ref = Block(jax_fn, torch_fn, bias)
    model = Block(jax_fn, torch_fn, bias).to(dev)
    model.load_state_dict(ref.state_dict())
    want_losses, want_params, _, _ = _train(ref, "cpu")
    losses, params, compiles, syncs = _train(model, dev)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), **TOL)
    for p, q in zip(params, want_params):
        torch.testing.assert_close(p, q, **TOL)
    # the step is one program: step 1 (no momentum yet) and step 2 compile one each, nothing after; each step
    # syncs once (its lazyxla.sync(); the loss read needs nothing more) and runs one program: nothing syncs inside
    assert compiles[1:] == [compiles[1]] * 3 and compiles[1] <= 2, compiles
    assert [(b[0] - a[0], b[1] - a[1]) for a, b in zip(syncs, syncs[1:])] == [(1, 1)] * 3, syncs


def test_the_step_is_one_program_with_one_call_jax_node_each_way(dev):
    torch.manual_seed(0)
    model = Block(jnp_block, torch_block).to(dev)
    x = torch.randn(16, 16).to(dev)
    lazyxla.sync()
    loss = model(x).square().mean()
    loss.backward()
    text = lazyxla.debug.ir_text([loss, model.w1.grad, model.w2.grad])
    assert text.count("lazyxla.call_jax") == 2, text  # the forward and its vjp
    lazyxla.sync()
    assert lazyxla.metrics.counters()["executions"] == 1


def test_a_lambda_made_anew_each_step_reuses_the_program(dev):
    x = torch.randn(4, 4).to(dev)
    compiles = []
    for _ in range(3):
        y = lazyxla.call_jax(lambda a, n: jnp.sin(a) * n, x, 3)  # a new function object every call
        lazyxla.sync()
        compiles.append(lazyxla.metrics.counters()["compiles"])
    assert compiles == [1, 1, 1]
    torch.testing.assert_close(y.cpu(), torch.sin(x.cpu()) * 3, **TOL)
    y4 = lazyxla.call_jax(lambda a, n: jnp.sin(a) * n, x, 4)  # another static value: another program
    lazyxla.sync()
    assert lazyxla.metrics.counters()["compiles"] == 2
    torch.testing.assert_close(y4.cpu(), torch.sin(x.cpu()) * 4, **TOL)


def test_custom_vjp_rule_is_used(dev):
    @jax.custom_vjp
    def sin_scaled_grad(x):
        return jnp.sin(x)

    sin_scaled_grad.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (3.0 * jnp.cos(x) * g,))
    x_cpu = torch.randn(5)
    x = x_cpu.to(dev).requires_grad_()
    y = lazyxla.call_jax(sin_scaled_grad, x)
    y.sum().backward()
    torch.testing.assert_close(y.detach().cpu(), torch.sin(x_cpu), **TOL)
    torch.testing.assert_close(x.grad.cpu(), 3.0 * torch.cos(x_cpu), **TOL)  # the rule's gradient, not cos(x)


def _scaled_sin(scale):
    @jax.custom_vjp
    def scaled(x):
        return jnp.sin(x)

    scaled.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (scale * jnp.cos(x) * g,))
    return scaled


def test_functions_that_print_alike_keep_their_own_rules_and_callbacks(dev, tmp_path):
    """jax prints a custom_vjp's rule and a callback's function by name alone: two of each, same name, same primal."""
    x_cpu = torch.randn(5)
    for scale in (3.0, 5.0):
        x = x_cpu.to(dev).requires_grad_()
        lazyxla.call_jax(_scaled_sin(scale), x).sum().backward()
        torch.testing.assert_close(x.grad.cpu(), scale * torch.cos(x_cpu), **TOL)

    def with_callback(k):
        def cb(a):
            return np.asarray(a) * k

        return lambda a: jax.pure_callback(cb, jax.ShapeDtypeStruct(a.shape, a.dtype), a)

    x = x_cpu.to(dev)
    # such a program skips the disk cache (jax cannot serialize its callbacks): no warning, nothing written
    with warnings.catch_warnings(), lazyxla.config.override(persistent_cache=True, cache_dir=str(tmp_path)):
        warnings.simplefilter("error", RuntimeWarning)
        for k in (2.0, 7.0):
            torch.testing.assert_close(lazyxla.call_jax(with_callback(k), x).cpu(), x_cpu * k, **TOL)
    assert not list(tmp_path.rglob("*.lxc")), list(tmp_path.rglob("*"))


def test_pytrees_static_arguments_integer_outputs_and_the_decorator(dev):
    @lazyxla.jax_function
    def stats(d, *, axis):
        x = d["x"] * d["scale"][0]
        return {"mean": jnp.mean(x, axis=axis), "argmax": jnp.argmax(x, axis=axis)}, None

    x_cpu = torch.randn(3, 4)
    x = x_cpu.to(dev).requires_grad_()
    out, none = stats({"x": x, "scale": [torch.tensor(2.0).to(dev)]}, axis=1)
    assert none is None and set(out) == {"mean", "argmax"}
    assert out["argmax"].dtype == torch.int64 and not out["argmax"].requires_grad
    torch.testing.assert_close(out["mean"].detach().cpu(), (x_cpu * 2).mean(1), **TOL)
    assert out["argmax"].cpu().tolist() == (x_cpu * 2).argmax(1).tolist()
    out["mean"].sum().backward()  # the integer output gets no cotangent (float0)
    torch.testing.assert_close(x.grad.cpu(), torch.full((3, 4), 0.5), **TOL)
    assert stats.jax_fn({"x": jnp.ones((2, 2)), "scale": [jnp.asarray(1.0)]}, axis=0)[0]["mean"].shape == (2,)


def test_second_order_gradients(dev):
    x_cpu = torch.randn(4, dtype=torch.float64)
    x = x_cpu.to(dev).requires_grad_()
    (g,) = torch.autograd.grad(lazyxla.call_jax(lambda a: jnp.sum(a**3), x), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close(g.detach().cpu(), 3 * x_cpu**2)
    torch.testing.assert_close(gg.cpu(), 6 * x_cpu)


class _Unhashable:
    __hash__ = None

    def __call__(self, a):
        return a


def test_errors_name_what_to_do(dev):
    x = torch.ones(2, 2).to(dev)
    with pytest.raises(ValueError, match=r"argument \[0\]\[0\] is a tensor on cpu.*lazyxla:0"):
        lazyxla.call_jax(jnp.sin, torch.ones(2))
    with pytest.raises(TypeError, match=r"argument \[0\]\[1\] \(ndarray\) is not a tensor.*hashable"):
        lazyxla.call_jax(lambda a, b: a + b, x, np.ones(2))
    with pytest.raises(TypeError, match=r"is a jax.Array.*lazyxla.from_jax"):
        lazyxla.call_jax(lambda a, b: a + b, x, jnp.ones(2))
    with pytest.raises(TypeError, match=r"fn returned float.*jax.Arrays"):
        lazyxla.call_jax(lambda a: (a, 1.0), x)
    with pytest.raises(TypeError, match=r"fn returned str"):
        lazyxla.call_jax(lambda a: {"y": "oops"}, x)
    with pytest.raises(TypeError, match="fn or a static argument is not hashable"):
        lazyxla.call_jax(_Unhashable(), x)
    with pytest.raises(ValueError, match="no tensor among the arguments"):
        lazyxla.call_jax(lambda n: jnp.ones(n), 3)
    x.requires_grad_()
    y = lazyxla.call_jax(
        lambda a: pl.pallas_call(_add_kernel, out_shape=jax.ShapeDtypeStruct((2, 2), a.dtype), interpret=True)(a, a), x
    )
    with pytest.raises(TypeError, match="cannot differentiate fn.*jax.custom_vjp"):
        y.sum().backward()
    with pytest.raises(TypeError, match="takes a lazyxla tensor"):
        lazyxla.to_jax(torch.ones(2))
    with pytest.raises(TypeError, match="concrete jax.Array"):
        lazyxla.from_jax(torch.ones(2))


def _compiled_add(x, y):  # no interpret=True: a kernel for a GPU or TPU
    return pl.pallas_call(_add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)


@jax.custom_vjp
def _add_compiled_backward(x, y):
    return pallas_add(x, y)


_add_compiled_backward.defvjp(lambda x, y: (pallas_add(x, y), None), lambda _, g: (_compiled_add(g, g), g))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="Pallas compiles kernels on GPUs and TPUs")
def test_a_pallas_kernel_not_interpreted_raises_at_the_call_on_the_cpu_naming_what_to_do(dev):
    """jax itself raises 'Only interpret mode is supported on CPU backend' only when the step's program is lowered."""
    x = torch.ones(8, 128).to(dev)
    with pytest.raises(ValueError, match=r"lazyxla.call_jax\(_compiled_add\).*interpret=True.*make_kernel_from_pallas"):
        lazyxla.call_jax(_compiled_add, x, x)
    with pytest.raises(ValueError, match="interpret=True"):  # inside a jit, found in the nested jaxpr
        lazyxla.call_jax(jax.jit(_compiled_add), x, x)
    x.requires_grad_()
    y = lazyxla.call_jax(_add_compiled_backward, x, x)  # the forward is interpreted, its backward is not
    with pytest.raises(ValueError, match=r"_add_compiled_backward.vjp\).*interpret=True"):
        y.sum().backward()
    assert lazyxla.metrics.counters().get("compiles", 0) == 0  # nothing was lowered


def test_to_jax_computes_only_what_the_tensor_needs_and_from_jax_round_trips(dev):
    a_cpu, b_cpu = torch.randn(3, 4), torch.randn(5)
    a, b = a_cpu.to(dev), b_cpu.to(dev)
    lazyxla.sync()
    lazyxla.metrics.reset()
    y = a * 2 + 1
    unrelated = b.exp()
    arr = lazyxla.to_jax(y)
    assert isinstance(arr, jax.Array) and arr.shape == (3, 4) and arr.dtype == jnp.float32
    assert lazyxla.debug.ir_text([unrelated]).count("aten.exp") == 1  # still pending: not computed
    assert lazyxla.metrics.counters()["executions"] == 1
    torch.testing.assert_close(torch.from_numpy(jax.device_get(arr).copy()), a_cpu * 2 + 1)
    assert lazyxla.to_jax(y) is arr  # already device data: the same buffer, nothing computed
    back = lazyxla.from_jax(arr * 3)
    assert back.device == dev and back.dtype == torch.float32
    torch.testing.assert_close(back.cpu(), (a_cpu * 2 + 1) * 3)
    assert lazyxla.to_jax(back) is lazyxla.to_jax(back)  # from_jax's own buffer, no copy
    half = lazyxla.from_jax(jnp.arange(4, dtype=jnp.bfloat16))
    assert half.dtype == torch.bfloat16 and half.float().cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    # DLPack: the array exports it (CPU backend: a torch CPU tensor over the same values)
    torch.testing.assert_close(torch.from_dlpack(arr), a_cpu * 2 + 1)


def test_shared_buffers_are_never_donated(dev):
    w = torch.ones(4).to(dev)
    arr = lazyxla.to_jax(w)
    w.mul_(2)  # an in-place update: its program may donate buffers no tensor holds any more
    lazyxla.sync()
    assert not arr.is_deleted() and jax.device_get(arr).tolist() == [1.0] * 4
    src = jnp.full((4,), 5.0, jnp.float32)
    t = lazyxla.from_jax(src)
    t.add_(1)
    lazyxla.sync()
    assert not src.is_deleted() and t.cpu().tolist() == [6.0] * 4


def test_captured_step_with_call_jax_replays_equal_to_lazy_mode(dev):
    def run(captured):
        torch.manual_seed(0)
        model = Block(jnp_block, torch_block).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, target = torch.randn(16, 16).to(dev), torch.randn(16, 8).to(dev)

        def step(x, target):
            opt.zero_grad()
            loss = F.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            return loss

        if captured:
            step = lazyxla.compile(step, capture=True)
        losses = [step(x, target).item() for _ in range(6)]
        return losses, step, [p.detach().cpu() for p in model.parameters()]

    lazy, _, lazy_params = run(False)
    lazyxla.metrics.reset()
    replayed, step, params = run(True)
    assert step.capture_status == "replaying", step.capture_status
    assert lazyxla.metrics.counters().get("capture_replays", 0) >= 2
    assert replayed == lazy
    for p, q in zip(params, lazy_params):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_exported_program_with_jax_and_pallas_runs_without_torch(tmp_path, dev):
    torch.manual_seed(0)
    ref = Block(pallas_block, torch_pallas_block, bias=True)
    model = Block(pallas_block, torch_pallas_block, bias=True).to(dev)
    model.load_state_dict(ref.state_dict())
    x = torch.randn(16, 16)
    exported = lazyxla.export(model, (x,))
    torch.testing.assert_close(torch.from_numpy(jax.device_get(exported.call(x)).copy()), ref(x).detach(), **TOL)
    x2 = torch.randn(16, 16)
    assert _consume(tmp_path, exported, [x2], 1, [[ref(x2).detach().numpy()]]) < 1e-5


def test_spmd_sharded_inputs_on_8_devices():
    (run,) = lazyxla.spawn(W.spmd_call_jax, nprocs=1, cpu_devices=8, timeout_s=240)
    assert run["worst"] < 1e-5, run
    assert run["shards"] == [(2, 8)] * 8, run  # the output stays split by rows over the 8 devices
    assert run["compiles"][1:] == [run["compiles"][0]] * 2, run  # steps 2 and 3 compile nothing
    assert run["to_jax_spec"] == ("data", None) and run["to_jax_equal"], run  # the global array, its layout kept
    assert run["from_jax_same"] and run["from_jax_shards"] == [(2,)] * 8 and run["from_jax_sum"] == 240.0, run


def test_torch_compile_runs_call_jax_in_the_step_program(dev):
    """Dynamo does not trace into call_jax (lazyxla's files are skipped): the function is split around it, and
    the compiled pieces and the call_jax node are recorded into one lazy graph, so the step is still one program."""
    torch.manual_seed(0)
    ref = Block(jnp_block, torch_block)
    model = Block(jnp_block, torch_block).to(dev)
    model.load_state_dict(ref.state_dict())
    want_losses, want_params, _, _ = _train(ref, "cpu")
    model.forward = torch.compile(model.forward, backend="lazyxla")
    losses, params, compiles, _ = _train(model, dev)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), **TOL)
    for p, q in zip(params, want_params):
        torch.testing.assert_close(p, q, **TOL)
    assert compiles[1:] == [compiles[1]] * 3 and compiles[1] <= 2, compiles
    assert lazyxla.metrics.counters()["jax_calls"] == 8  # forward and backward, 4 steps


def test_call_jax_inside_a_scanned_loop(dev):
    """The loop body is traced once: its call_jax node (and its vjp's) become part of the scanned body."""
    torch.manual_seed(0)
    w_cpu, xs_cpu = torch.randn(4, 4, requires_grad=True), torch.randn(5, 2, 4)
    w = w_cpu.detach().to(dev).requires_grad_()

    def body(carry, x):
        h, w = carry
        h = lazyxla.call_jax(lambda a, b: jnp.tanh(a @ b), h + x, w)
        return (h, w), h.sum()

    (h, _), ys = lazyxla.scan(body, (torch.zeros(2, 4).to(dev), w), xs_cpu.to(dev))
    (h.sum() + ys.sum()).backward()
    h_cpu, total = torch.zeros(2, 4), 0
    for x in xs_cpu:
        h_cpu = torch.tanh((h_cpu + x) @ w_cpu)
        total = total + h_cpu.sum()
    (h_cpu.sum() + total).backward()
    torch.testing.assert_close(h.detach().cpu(), h_cpu.detach(), **TOL)
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad, **TOL)
    assert lazyxla.metrics.counters()["jax_calls"] == 2  # one trace of the body, forward and backward
