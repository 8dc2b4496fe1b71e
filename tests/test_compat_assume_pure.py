"""``torch_xla.experimental.assume_pure`` on lazyxla: a pure function traced once, its trace reused (a one-iteration
``lazyxla.scan`` kept with ``pure=True``); values and gradients against the same function run eagerly on the CPU,
the trace count, ``rng_seed``, ``PureModule`` and ``XLAShardedTensor`` outputs."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

import lazyxla
import lazyxla.compat as compat

TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture
def ap():
    assert compat.install()
    import torch_xla.experimental.assume_pure as ap

    yield ap
    compat.uninstall()


def test_a_transformer_block_traced_once_equals_eager_values_and_gradients(ap, dev):
    torch.manual_seed(0)
    block = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    x = torch.randn(2, 8, 32)
    want = block(x)
    want.square().mean().backward()
    want_grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    pure = ap.PureModule(block).to(dev)
    traces = []
    real_forward = block.forward
    block.forward = lambda *a, **k: (traces.append(1), real_forward(*a, **k))[1]
    compiles = []
    for _ in range(3):
        pure.zero_grad()
        y = pure(x.to(dev))
        y.square().mean().backward()
        lazyxla.sync()
        torch.testing.assert_close(y.cpu(), want, **TOL)
        for p, g in zip(pure.parameters(), want_grads):
            torch.testing.assert_close(p.grad.cpu(), g, **TOL)
        compiles.append(lazyxla.metrics.counters()["compiles"])
    assert len(traces) == 1  # steps 2 and 3 record no op of the block
    assert compiles[1] == compiles[2], compiles  # and compile nothing


def test_a_dropped_pure_module_and_function_are_freed_with_their_traces(ap, dev):
    # the trace cache is keyed by the function: it must not keep a PureModule's module (and its device
    # parameters) or a decorated function alive once the user drops them
    def run():
        inner = nn.Linear(4, 4)
        pure = ap.PureModule(inner).to(dev)
        pure(torch.randn(2, 4, device=dev)).sum().backward()

        def double(a):
            return a * 2

        ap.assume_pure(double)(torch.ones(3, device=dev))
        lazyxla.sync()
        assert len(ap._XLA_COMPUTATION_CACHE) == before + 2
        return weakref.ref(inner), weakref.ref(double)

    before = len(ap._XLA_COMPUTATION_CACHE)
    refs = run()
    gc.collect()
    assert [r() for r in refs] == [None, None]
    assert len(ap._XLA_COMPUTATION_CACHE) == before


def test_static_arguments_kwargs_and_partial_gradients(ap, dev):
    calls = []

    @ap.assume_pure
    def fn(a, b, *, scale, bias=None):
        calls.append(scale)
        out = torch.sin(a @ b) * scale
        return {"out": out if bias is None else out + bias, "aux": a.sum()}

    a, b, bias = torch.randn(3, 4), torch.randn(4, 2), torch.randn(2)
    ad, bd = a.to(dev).requires_grad_(), b.to(dev)
    got = fn(ad, bd, scale=2.0, bias=bias.to(dev))
    a0 = a.clone().requires_grad_()
    want = torch.sin(a0 @ b) * 2.0 + bias
    torch.testing.assert_close(got["out"].cpu(), want.detach(), **TOL)
    torch.testing.assert_close(got["aux"].cpu(), a.sum(), **TOL)
    got["out"].sum().backward()
    want.sum().backward()
    torch.testing.assert_close(ad.grad.cpu(), a0.grad, **TOL)
    fn(ad, bd, scale=2.0, bias=bias.to(dev))
    fn(ad, bd, scale=3.0, bias=bias.to(dev))  # another static value: another trace
    assert calls == [2.0, 3.0]


def test_rng_seed_gives_the_same_numbers_for_the_same_seed(ap, dev):
    noisy = ap.assume_pure(lambda a: a + torch.rand_like(a), add_rng_seed_argument=True)
    a = torch.zeros(4, 4).to(dev)
    with pytest.raises(AssertionError, match="rng_seed"):
        noisy(a)
    r0, r1, r0_again = noisy(a, rng_seed=0).cpu(), noisy(a, rng_seed=1).cpu(), noisy(a, rng_seed=0).cpu()
    assert torch.equal(r0, r0_again) and not torch.equal(r0, r1)
    assert ((r0 >= 0) & (r0 < 1)).all()


def test_assume_pure_torch_and_a_mark_sharding_output_on_8_devices(tmp_path):
    script = textwrap.dedent(
        """
        import numpy as np, torch, lazyxla.compat as compat
        compat.install()
        import torch_xla, torch_xla.runtime as xr, torch_xla.distributed.spmd as xs
        from torch_xla.experimental.assume_pure import assume_pure, assume_pure_torch
        xr.use_spmd()
        mesh = xs.Mesh(np.arange(8), (8,), ("model",))
        x = torch.randn(8, 4)
        y = assume_pure(xs.mark_sharding)(x.to("xla"), mesh, ("model", None))
        torch_xla.sync()
        assert "devices=[8" in torch_xla._XLAC._get_xla_sharding_spec(y), torch_xla._XLAC._get_xla_sharding_spec(y)
        assert torch.equal(y.cpu(), x)
        assert mesh.get_jax_mesh().devices.shape == (8,)
        with torch.no_grad():
            z = assume_pure_torch(lambda a: torch.tanh(a) * 2)(x.to("xla"))
        torch.testing.assert_close(z.cpu(), torch.tanh(x) * 2)
        print("ok")
        """
    )
    path = tmp_path / "spmd_pure.py"
    path.write_text(script)
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "8"}
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-m", "lazyxla.run", str(path)], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]
