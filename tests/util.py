"""Test helpers: run the same function on CPU eager and on lazyxla, and compare."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

import lazyxla
from lazyxla.device.devices import on_device


def to_dev(x, dev=None):
    dev = dev or lazyxla.device()
    if isinstance(x, torch.Tensor):
        return x.detach().to(dev).requires_grad_(x.requires_grad)
    if isinstance(x, (list, tuple)):
        return type(x)(to_dev(e, dev) for e in x)
    if isinstance(x, dict):
        return {k: to_dev(v, dev) for k, v in x.items()}
    return x


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(e) for e in x)
    return x


def assert_same(actual, expected, rtol=1e-5, atol=1e-5, check_dtype=True):
    """Compare lazyxla results (moved to CPU) with CPU eager results: values, shapes and dtypes."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual)}"
        assert on_device(actual), f"output lives on {actual.device}, not on lazyxla"
        torch.testing.assert_close(to_cpu(actual), expected, rtol=rtol, atol=atol, check_dtype=check_dtype)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, rtol, atol, check_dtype)
    else:
        assert actual == expected, (actual, expected)


def check(fn, *args, rtol=1e-5, atol=1e-5, grad=False, **kwargs):
    """Run ``fn(*args, **kwargs)`` on CPU and on lazyxla; assert equal outputs (and input grads)."""
    cpu_args = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
    dev_args = to_dev(args)
    expected = fn(*cpu_args, **kwargs)
    actual = fn(*dev_args, **to_dev(kwargs))
    assert_same(actual, expected, rtol, atol)
    if grad:
        out_cpu = expected if isinstance(expected, torch.Tensor) else expected[0]
        out_dev = actual if isinstance(actual, torch.Tensor) else actual[0]
        g = torch.randn_like(out_cpu)
        out_cpu.backward(g)
        out_dev.backward(to_dev(g))
        for a, d in zip(cpu_args, dev_args):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                assert_same(d.grad, a.grad, rtol, atol)
    return actual


def uniform(*shape, lo=-3.0, hi=3.0, grad=False, dtype=torch.float32, seed=0):
    """A reproducible float input drawn uniformly from [lo, hi)."""
    torch.manual_seed(seed + sum(shape))
    x = torch.rand(shape, dtype=torch.float64) * (hi - lo) + lo
    return x.to(dtype).requires_grad_(grad)


def integers(*shape, lo=-5, hi=6, dtype=torch.int64, seed=0):
    """A reproducible integer input drawn from [lo, hi)."""
    torch.manual_seed(seed + sum(shape))
    return torch.randint(lo, hi, shape).to(dtype)


def normal(*shape, grad=True, seed=0, dtype=torch.float32):
    """A reproducible standard-normal input (requires grad by default)."""
    g = torch.Generator().manual_seed(seed + 7 * len(shape) + sum(shape))
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_(grad)


def train_steps(model, batch: dict, loss_of, make_opt, device, steps, on_step=None):
    """``steps`` optimizer steps of ``loss_of(model, **batch)`` on ``device`` (zero_grad after step, a sync per step on
    lazyxla, ``on_step()`` after each); the moved model and each step's loss. The batch's tensors move to ``device``;
    its other values (``return_loss=True``) pass as they are."""
    model = model.to(device)
    opt = make_opt(model.parameters())
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    losses = []
    for _ in range(steps):
        loss = loss_of(model, **batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if on_device(device):
            lazyxla.sync()
        losses.append(loss.detach())
        if on_step is not None:
            on_step()
    return model, [float(v.item()) for v in losses]


def captured_step(loss_of, opt, captured):
    """A training step ``step(*batch)``: ``loss_of(*batch)``, backward, ``opt.step()``, ``opt.zero_grad()``, the loss
    returned; under ``lazyxla.compile(capture=captured)`` unless ``captured`` is None (eager, or lazy mode without
    a region). The whole-step capture tests compare ``True`` against ``False`` (lazy mode in a region).

    Example::

        step = captured_step(lambda x, y: F.mse_loss(model(x), y), opt, captured=True)
    """

    def step(*batch):
        loss = loss_of(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step if captured is None else lazyxla.compile(step, capture=captured)


ROOT = Path(__file__).resolve().parents[1]

# Variables of the test's own environment that would change how a script runs in a child process.
SCRUBBED_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "PJRT_DEVICE",
    "CPU_NUM_DEVICES",
    "GPU_NUM_DEVICES",
    "TPU_NUM_DEVICES",
    "JAX_PLATFORMS",
)


def script_env(**extra: str) -> dict[str, str]:
    """The environment of a child Python: this one without launcher, PJRT and lazyxla variables, lazyxla on
    ``PYTHONPATH``, jax on the CPU, no persistent compile cache; ``extra`` on top."""
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV and not k.startswith("LAZYXLA_")}
    env.update(PYTHONPATH=str(ROOT), LAZYXLA_PERSISTENT_CACHE="0", JAX_PLATFORMS="cpu")
    env.update(extra)
    return env


def quick_compile_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with XLA's CPU backend at its lowest optimization level (added to any ``XLA_FLAGS`` there).

    For the smoke tests of the benchmark harness: they check that every number is there, that nothing compiles
    after step 2 and that the frameworks' losses agree, never how fast a program runs, and XLA's backend
    optimizations were about a third of their time (tiny models, dozens of programs compiled).
    """
    flags = f"{env.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()
    return dict(env, XLA_FLAGS=flags)


def run_python(args: list[str], cwd: Path, timeout: int = 240, **extra: str) -> subprocess.CompletedProcess:
    """``python *args`` in ``cwd`` with :func:`script_env`; output captured. The child leads a new process
    group: on a timeout the whole group (the processes it started included) is killed before raising."""
    with subprocess.Popen(
        [sys.executable, *args],
        env=script_env(**extra),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_torch_xla_script(script: str, cwd: Path, timeout: int, **extra: str):
    """Run ``script`` (source text) as torch_xla code under ``python -m lazyxla.run`` in ``cwd`` with
    :func:`script_env` plus ``extra``; returns the object the script printed as its ``RESULT <json>`` line.
    A failing script fails the test with its output's tail."""
    (cwd / "script.py").write_text(script)
    proc = run_python(["-m", "lazyxla.run", "script.py"], cwd, timeout=timeout, **extra)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]
    return json.loads(proc.stdout.split("RESULT ", 1)[1])


def run_case(test_file: str, case: str, *args, timeout: int = 240) -> None:
    """Run the function ``case`` of the test module at ``test_file`` (under tests/), with ``args`` (literals),
    in a fresh Python and fail unless it exits cleanly: an exception, and a crash (a signal: the return code is
    negative), both fail the test, with the child's output. The child does the work and asserts; the test
    process only watches it.

    Example::

        def test_views(): run_case(__file__, "_views")      # _views() runs in its own process
    """
    module = f"tests.{Path(test_file).stem}"
    proc = run_python(["-c", f"import {module} as m; m.{case}(*{args!r})"], cwd=ROOT, timeout=timeout)
    assert proc.returncode == 0, f"{case} exited with {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
