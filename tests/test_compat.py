"""The torch_xla compatibility layer: torch_xla scripts run unmodified under ``python -m lazyxla.run``.

The three scripts of ``examples/torch_xla`` (single device, ``xmp.spawn`` data parallel, SPMD) run in
subprocesses (bounded by a timeout; ``xmp.spawn``'s replicas exit when their parent goes) and their
per-step losses are compared with the same model and data trained eagerly on the CPU here. The rest
checks the mapping itself in this process: names, signatures, constants, metrics, step closures,
``NotImplementedError`` for what is not supported, and that ``install()`` never shadows a real torch_xla.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import lazyxla
import lazyxla.compat as compat
from tests.util import ROOT, run_python

EXAMPLES = ROOT / "examples" / "torch_xla"
RTOL = 1e-5  # relative difference allowed between a loss on lazyxla and on CPU eager


def _run_example(name: str, args: list[str], tmp_path: Path, writes: tuple = (), **extra: str) -> str:
    proc = run_python(["-m", "lazyxla.run", str(EXAMPLES / name), *args], tmp_path, **extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(writes), "the script wrote other files"
    return proc.stdout


_LOSS = re.compile(r"loss ((?:\w+=\d+ )*)value=([-+]?(?:\d+(?:\.\d*)?(?:e[-+]?\d+)?|nan|inf))")


def _losses(stdout: str) -> dict[tuple, float]:
    """``loss k=v ... value=V`` records: {(v, ...): V}, keys in the record's order. Replicas print to the
    same pipe; a line's text is one write but its newline another, so records may share a line."""
    out = {}
    for m in _LOSS.finditer(stdout):
        key = tuple(int(kv.split("=")[1]) for kv in m.group(1).split())
        assert key not in out, f"{key} printed twice"
        out[key] = float(m.group(2))
    return out


def _assert_close(got: dict, want: dict) -> None:
    rel = max(abs(got[k] - want[k]) / max(abs(want[k]), 1e-12) for k in want)
    print(f"{len(want)} losses, largest relative difference from CPU eager {rel:.2e}")
    assert rel < RTOL, (got, want)


@pytest.fixture
def xla():
    """The compatibility layer installed in this process (removed again afterwards)."""
    assert compat.install()
    import torch_xla

    yield torch_xla
    compat.uninstall()


def _example(name: str):
    """The example script imported as a module (for its model and data; its main part does not run)."""
    spec = importlib.util.spec_from_file_location(f"_torch_xla_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the three scripts against CPU eager ----------------------------------------------------------


def _eager_losses(flags, make_model, make_data, loss_fn) -> list[float]:
    """The per-step losses of a script's training loop in CPU eager (SGD with momentum, data in order)."""
    torch.manual_seed(flags.seed)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=flags.lr, momentum=flags.momentum)
    loader = torch.utils.data.DataLoader(
        make_data(flags.batch_size * flags.steps), batch_size=flags.batch_size, shuffle=False, drop_last=True
    )
    losses = []
    for data, target in loader:
        opt.zero_grad()
        loss = loss_fn(model(data), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_single_device_mnist_equals_cpu_eager(xla, tmp_path):
    ex = _example("mnist_single")
    args = ["--steps", "6", "--batch-size", "16"]
    stdout = _run_example("mnist_single.py", args, tmp_path)
    got = _losses(stdout)

    flags = ex.parse_args(args)
    losses = _eager_losses(flags, ex.MNIST, ex.fake_mnist, F.nll_loss)
    want = {(0, step): loss for step, loss in enumerate(losses)}
    assert sorted(got) == sorted(want), stdout
    _assert_close(got, want)
    assert stdout.strip().splitlines()[-1] == f"final loss {got[(0, flags.steps - 1)]!r}"


def test_xmp_spawn_data_parallel_equals_one_process_on_the_whole_batch(xla, tmp_path):
    ex = _example("mnist_xmp")
    world = 2
    args = ["--steps", "4", "--batch-size", "8", "--ckpt", str(tmp_path / "model.pt")]
    stdout = _run_example("mnist_xmp.py", args, tmp_path, writes=("model.pt",), CPU_NUM_DEVICES=str(world))
    got = _losses(stdout)

    # CPU eager, one process: every replica's loss at the current weights, then SGD on their mean (what
    # averaging the replicas' gradients computes).
    flags = ex.parse_args(args)
    torch.manual_seed(1)
    model = ex.MNIST()
    opt = torch.optim.SGD(model.parameters(), lr=flags.lr * world, momentum=flags.momentum)
    data = ex.fake_mnist(flags.batch_size * flags.steps * world, seed=0)
    shards = [
        list(
            torch.utils.data.DataLoader(
                data,
                batch_size=flags.batch_size,
                sampler=torch.utils.data.DistributedSampler(data, num_replicas=world, rank=r, shuffle=False),
                drop_last=True,
            )
        )
        for r in range(world)
    ]
    want = {}
    for step in range(flags.steps):
        opt.zero_grad()
        losses = [F.nll_loss(model(shards[r][step][0]), shards[r][step][1]) for r in range(world)]
        for r, loss in enumerate(losses):
            want[(r, 0, step)] = loss.item()
        (sum(losses) / world).backward()
        opt.step()
    assert sorted(got) == sorted(want), stdout
    _assert_close(got, want)

    # the master's report: accuracy averaged over the replicas (xm.mesh_reduce), its last loss
    test = ex.fake_mnist(flags.test_samples, seed=1)
    accuracies = []
    with torch.no_grad():
        for r in range(world):
            idx = list(torch.utils.data.DistributedSampler(test, num_replicas=world, rank=r, shuffle=False))
            x, y = test[idx]
            accuracies.append(100.0 * (model(x).argmax(1) == y).sum().item() / len(idx))
    reported = float(re.search(r"^test_accuracy=(\S+)$", stdout, re.M).group(1))
    assert abs(reported - sum(accuracies) / world) <= 100.0 / len(idx)  # a near tie may flip one sample
    assert stdout.count("final loss") == 1 and stdout.count("test_accuracy=") == 1  # master_print
    state = torch.load(tmp_path / "model.pt")  # xm.save: CPU tensors, written by the master
    assert set(state) == set(model.state_dict())
    assert all(v.device.type == "cpu" for v in state.values())
    for name, value in model.state_dict().items():
        torch.testing.assert_close(state[name], value, rtol=1e-4, atol=1e-5)


def test_spmd_script_equals_cpu_eager(xla, tmp_path):
    ex = _example("spmd_train")
    args = ["--steps", "5", "--model-parallel", "2"]
    stdout = _run_example("spmd_train.py", args, tmp_path, PJRT_DEVICE="CPU", CPU_NUM_DEVICES="4")
    assert stdout.splitlines()[0] == "mesh {'data': 2, 'model': 2} over 4 CPU devices"
    got = _losses(stdout)

    flags = ex.parse_args(args)
    losses = _eager_losses(flags, ex.MLP, ex.fake_data, F.cross_entropy)
    want = {(step,): loss for step, loss in enumerate(losses)}
    assert sorted(got) == sorted(want), stdout
    _assert_close(got, want)


SPMD_MAPPING = """
import numpy as np, torch
import lazyxla
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr
import torch_xla.distributed.spmd as xs
import torch_xla.distributed.parallel_loader as pl
xr.use_spmd()
assert xr.is_spmd() and xr.global_runtime_device_count() == 4
mesh = xs.Mesh(np.array([0, 2, 1, 3]), (2, 2))                   # unnamed axes, addressed by index
assert list(mesh.shape().items()) == [(0, 2), (1, 2)]
assert mesh.get_logical_mesh().tolist() == [[0, 2], [1, 3]] and mesh.size() == 4
w = torch.randn(8, 6).to(xm.xla_device())
st = xs.mark_sharding(w, mesh, (1, None))                         # annotates w, returns it wrapped (torch_xla)
assert isinstance(st, xs.XLAShardedTensor) and st.global_tensor is w and st.partition_spec == (1, None)
m, spec = lazyxla.spmd.get_sharding(w)
assert m is mesh.lazyxla_mesh and spec == ("axis1", None), spec
xs.clear_sharding(w)
assert lazyxla.spmd.get_sharding(w) is None
named = xs.Mesh(np.arange(4), (4, 1), ("data", "model"))
xs.set_global_mesh(named)
assert xs.get_global_mesh() is named and named.get_axis_name_idx("model") == 1
assert xs.get_1d_mesh("x").mesh_shape == (4,)
assert xs.HybridMesh(ici_mesh_shape=(2, 2), axis_names=("a", "b")).mesh_shape == (2, 2)
data = [(torch.randn(8, 4)[:, 1:], torch.arange(8)) for _ in range(2)]  # x non-contiguous
recorded = lazyxla.metrics.counters()["ops_recorded"]
for x, y in pl.MpDeviceLoader(data, xm.xla_device(), input_sharding=xs.ShardingSpec(named, ("data", None))):
    assert lazyxla.spmd.get_sharding(x)[1] == ("data", None)
    assert lazyxla.spmd.get_sharding(y) is None                  # rank 1: the 2-entry spec does not apply
assert lazyxla.metrics.counters()["ops_recorded"] == recorded     # the loader's thread recorded nothing
print("ok")
"""


def test_spmd_mapping_of_meshes_specs_and_loader_sharding(tmp_path):
    script = tmp_path / "spmd_mapping.py"
    script.write_text(SPMD_MAPPING)
    proc = run_python(["-m", "lazyxla.run", str(script)], tmp_path, timeout=120, CPU_NUM_DEVICES="4")
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout[-2000:] + proc.stderr[-4000:]


# --- install / uninstall ----------------------------------------------------------------------------


def test_install_maps_torch_xla_names_onto_the_compat_modules(xla):
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs
    import torch_xla.experimental.xla_sharding as xs_old
    import torch_xla.runtime as xr
    from torch_xla.distributed import parallel_loader as pl
    from torch_xla.distributed import xla_multiprocessing as xmp

    from lazyxla.compat import torch_xla as package

    assert xla is package and xla.runtime is xr and xla.core.xla_model is xm
    assert xm.__name__ == "lazyxla.compat.torch_xla.core.xla_model"  # one module object under both names
    assert sys.modules["torch_xla.core.xla_model"] is xm
    assert xs_old.Mesh is xs.Mesh and pl.MpDeviceLoader and xmp.spawn and met.counter_value
    with pytest.raises(ModuleNotFoundError, match="torch_xla.no_such_module"):
        import torch_xla.no_such_module  # noqa: F401
    assert importlib.util.find_spec("torch_xla.no_such_module") is None
    with pytest.raises(AttributeError, match="compatibility layer does not provide it"):
        xm.no_such_function  # noqa: B018
    assert compat.install() and compat.installed()  # idempotent


def test_uninstall_removes_every_trace():
    assert compat.install()
    import torch_xla.core.xla_model  # noqa: F401

    compat.uninstall()
    assert not compat.installed()
    assert not [n for n in sys.modules if n == "torch_xla" or n.startswith("torch_xla.")]
    assert compat.PATH_DIR not in sys.path
    assert not [f for f in sys.meta_path if type(f).__module__ == "lazyxla.compat"]
    with pytest.raises(ModuleNotFoundError):
        import torch_xla  # noqa: F401
    assert compat.install()  # and back
    compat.uninstall()


def test_install_never_shadows_a_real_torch_xla(tmp_path):
    real = tmp_path / "site" / "torch_xla"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    code = (
        "import lazyxla.compat as c, sys\n"
        "print(c.install(), c.installed(), c.real_torch_xla() is not None)\n"
        "import torch_xla\n"
        "print(getattr(torch_xla, 'REAL', False))\n"
    )
    env = {"PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{ROOT}"}
    proc = run_python(["-c", code], tmp_path, timeout=120, **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["False", "False", "True", "True"]

    script = tmp_path / "uses_torch_xla.py"
    script.write_text("import torch_xla\nprint('real' if getattr(torch_xla, 'REAL', False) else 'compat')\n")
    proc = run_python(["-m", "lazyxla.run", str(script)], tmp_path, timeout=120, **env)
    assert proc.returncode == 0 and proc.stdout.strip() == "real", proc.stderr[-3000:]
    assert "a real torch_xla is installed" in proc.stderr


def test_run_passes_arguments_and_runs_modules(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "tool.py").write_text(
        "import sys, torch_xla\nprint(__name__, sys.argv[1:], torch_xla.__name__)\n"
    )
    proc = run_python(["-m", "lazyxla.run", "-m", "pkg.tool", "--flag", "x"], tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "__main__ ['--flag', 'x'] lazyxla.compat.torch_xla"
    proc = run_python(["-m", "lazyxla.run"], tmp_path, timeout=120)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_run_gives_the_script_the_sys_path_python_gives_it(tmp_path):
    # python script.py: the script's folder first, the current folder not on sys.path at all
    cwd, scripts = tmp_path / "cwd", tmp_path / "scripts"
    (cwd / "torch_xla").mkdir(parents=True)
    (cwd / "torch_xla" / "__init__.py").write_text("raise RuntimeError('the torch_xla folder of the current folder')\n")
    (cwd / "helper.py").write_text("WHERE = 'cwd'\n")
    scripts.mkdir()
    (scripts / "helper.py").write_text("WHERE = 'script'\n")
    script = scripts / "main.py"
    script.write_text(
        "import os, sys\nimport helper\n"
        "print(helper.WHERE, sys.path[0] == os.path.dirname(os.path.realpath(__file__)), os.getcwd() in sys.path)\n"
        "if len(sys.argv) > 1:\n    import torch_xla\n    print(torch_xla.__name__)\n"
    )
    plain = run_python([str(script)], cwd, timeout=120)
    assert plain.returncode == 0 and plain.stdout.split() == ["script", "True", "False"], plain.stderr[-3000:]
    proc = run_python(["-m", "lazyxla.run", str(script), "torch_xla"], cwd, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["script", "True", "False", "lazyxla.compat.torch_xla"]
    assert "a real torch_xla is installed" not in proc.stderr
    relative = run_python(["-m", "lazyxla.run", os.path.join("..", "scripts", "main.py")], cwd, timeout=120)
    assert relative.returncode == 0 and relative.stdout.split() == plain.stdout.split(), relative.stderr[-3000:]


# --- the mapping, in this process --------------------------------------------------------------------


SIGNATURES = {
    "torch_xla.device": ["index"],
    "torch_xla.sync": ["wait", "reset_scope"],
    "torch_xla.compile": ["f", "full_graph", "name", "max_different_graphs"],
    "torch_xla.launch": ["fn", "args", "start_method", "debug_single_process"],
    "torch_xla.manual_seed": ["seed", "device"],
    "torch_xla.core.xla_model.xla_device": ["n", "devkind"],
    "torch_xla.core.xla_model.mark_step": ["wait", "reset_scope"],
    "torch_xla.core.xla_model.optimizer_step": ["optimizer", "barrier", "optimizer_args", "groups", "pin_layout"],
    "torch_xla.core.xla_model.reduce_gradients": ["optimizer", "groups", "pin_layout"],
    "torch_xla.core.xla_model.all_reduce": ["reduce_type", "inputs", "scale", "groups", "pin_layout"],
    "torch_xla.core.xla_model.all_gather": ["value", "dim", "groups", "output", "pin_layout"],
    "torch_xla.core.xla_model.reduce_scatter": [
        "reduce_type",
        "input",
        "scale",
        "scatter_dim",
        "shard_count",
        "groups",
        "output",
        "pin_layout",
    ],
    "torch_xla.core.xla_model.all_to_all": [
        "value",
        "split_dimension",
        "concat_dimension",
        "split_count",
        "groups",
        "pin_layout",
    ],
    "torch_xla.core.xla_model.collective_permute": ["value", "pairs"],
    "torch_xla.core.xla_model.rendezvous": ["tag", "payload", "replicas"],
    "torch_xla.core.xla_model.mesh_reduce": ["tag", "data", "reduce_fn"],
    "torch_xla.core.xla_model.save": ["data", "file_or_path", "master_only", "global_master"],
    "torch_xla.core.xla_model.master_print": ["args", "fd", "local", "flush"],
    "torch_xla.core.xla_model.is_master_ordinal": ["local"],
    "torch_xla.core.xla_model.get_ordinal": ["defval"],
    "torch_xla.core.xla_model.xrt_world_size": ["defval"],
    "torch_xla.core.xla_model.xla_device_hw": ["device"],
    "torch_xla.core.xla_model.get_memory_info": ["device"],
    "torch_xla.core.xla_model.add_step_closure": ["closure", "args", "run_async"],
    "torch_xla.core.xla_model.wait_device_ops": ["devices"],
    "torch_xla.core.xla_model.set_rng_state": ["seed", "device"],
    "torch_xla.core.xla_model.get_rng_state": ["device"],
    "torch_xla.core.xla_model.set_replication": ["device", "devices"],
    "torch_xla.core.xla_model._fetch_gradients": ["optimizer"],
    "torch_xla.core.xla_model._maybe_convert_to_cpu": ["data", "convert"],
    "torch_xla.runtime.use_spmd": ["auto"],
    "torch_xla.distributed.xla_multiprocessing.spawn": ["fn", "args", "nprocs", "join", "daemon", "start_method"],
    "torch_xla.distributed.parallel_loader.MpDeviceLoader": ["loader", "device", "kwargs"],
    "torch_xla.distributed.parallel_loader.ParallelLoader": [
        "loader",
        "devices",
        "batchdim",
        "fixed_batch_size",
        "loader_prefetch_size",
        "device_prefetch_size",
        "host_to_device_transfer_threads",
        "input_sharding",
        "pad_to_buckets",  # lazyxla's own, keyword-only: shape buckets for variable-length batches
    ],
    "torch_xla.distributed.spmd.Mesh": ["device_ids", "mesh_shape", "axis_names"],
    "torch_xla.distributed.spmd.HybridMesh": ["ici_mesh_shape", "dcn_mesh_shape", "axis_names"],
    "torch_xla.distributed.spmd.mark_sharding": ["t", "mesh", "partition_spec"],
    "torch_xla.distributed.spmd.clear_sharding": ["t"],
    "torch_xla.debug.metrics.counter_value": ["name"],
    "torch_xla.debug.metrics.metric_data": ["name"],
    "torch_xla.debug.metrics.short_metrics_report": ["counter_names", "metric_names"],
    "torch_xla.amp.autocast": ["device", "enabled", "dtype", "cache_enabled"],
}


@pytest.mark.parametrize("qualname", sorted(SIGNATURES))
def test_signatures_take_torch_xla_argument_names(xla, qualname):
    module, name = qualname.rsplit(".", 1)
    fn = getattr(importlib.import_module(module), name)
    params = [p for p in inspect.signature(fn).parameters if p != "self"]
    assert params == SIGNATURES[qualname]


def test_constants_devices_and_replica_facts(xla, dev):
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    assert (xm.REDUCE_SUM, xm.REDUCE_MUL, xm.REDUCE_AND, xm.REDUCE_OR, xm.REDUCE_MIN, xm.REDUCE_MAX) == (
        "sum",
        "mul",
        "and",
        "or",
        "min",
        "max",
    )
    assert xm.xla_device() == xla.device() == dev and xla.devices() == lazyxla.devices()
    assert xm.xla_device_hw(dev) == xr.device_type() == {"cpu": "CPU", "gpu": "CUDA", "tpu": "TPU"}[lazyxla.platform()]
    assert (xm.xrt_world_size(), xm.get_ordinal(), xm.get_local_ordinal(), xm.is_master_ordinal()) == (1, 0, 0, True)
    assert (xr.world_size(), xr.global_ordinal(), xr.local_ordinal(), xr.process_count()) == (1, 0, 0, 1)
    assert xr.using_pjrt() and not xr.is_spmd() and xr.global_runtime_device_count() == 1
    assert xm.get_xla_supported_devices() == ["lazyxla:0"] and xm.is_xla_tensor(torch.zeros(1, device=dev))


def test_collectives_in_a_single_replica_behave_as_torch_xla(xla, dev):
    import torch_xla.core.xla_model as xm

    x = torch.arange(6.0).reshape(2, 3).to(dev)
    same = xm.all_reduce(xm.REDUCE_SUM, x, scale=0.5)  # torch_xla: one replica -> a copy, scale not applied
    assert same is not x and torch.equal(same.cpu(), x.cpu())
    lst = [x.clone()]
    assert xm.all_reduce(xm.REDUCE_MAX, lst, scale=3.0) is lst and torch.equal(lst[0].cpu(), x.cpu())
    out = torch.zeros(2, 3, device=dev)
    assert xm.all_gather(x, dim=0, output=out) is out and torch.equal(out.cpu(), x.cpu())
    half = xm.reduce_scatter(xm.REDUCE_SUM, x, 0.5, 0, 1)
    torch.testing.assert_close(half.cpu(), x.cpu() / 2)
    assert torch.equal(xm.all_to_all(x, 0, 1, 1).cpu(), x.cpu())
    assert torch.equal(xm.collective_permute(x, [[0, 0]]).cpu(), x.cpu())
    assert xm.rendezvous("alone", b"hi") == [b"hi"]
    total = xm.mesh_reduce("alone", {"n": x.sum()}, lambda xs: sum(d["n"] for d in xs))
    assert total.device.type == "cpu" and total.item() == 15.0
    with pytest.raises(ValueError, match="reduce_type"):
        xm.all_reduce("average", x)
    with pytest.raises(TypeError, match="bytes"):
        xm.rendezvous("alone", "text")


def test_training_with_closures_optimizer_step_and_metrics(xla, dev, tmp_path):
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4).to(dev), torch.randn(8, 2).to(dev)
    met.clear_all()
    seen = []
    for step in range(3):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        xm.add_step_closure(lambda s, v: seen.append((s, v.item())), args=(step, loss))
        assert len(seen) == step
        xm.optimizer_step(opt, barrier=step == 2)
        opt.zero_grad()
        if step < 2:
            xm.mark_step()
        assert [s for s, _ in seen] == list(range(step + 1))  # run at the step marker, in order
    assert met.counter_value("MarkStep") == 3
    assert met.counter_value("UncachedCompile") == lazyxla.metrics.counters()["compiles"] >= 1
    assert met.counter_value("CachedCompile") >= 1
    assert met.counter_value("aten::no_such_op") is None and "MarkStep" in met.counter_names()
    assert {"CompileTime", "ExecuteTime", "compile"} <= set(met.metric_names())
    count, total_ns, samples = met.metric_data("ExecuteTime")
    assert count == len(samples) >= 3 and total_ns > 0
    assert met.metric_data("NoSuchMetric") is None
    assert "Counter: MarkStep" in met.short_metrics_report()
    assert "Counter: MarkStep\n  Value: 3\n" in met.metrics_report()  # torch_xla's layout (it was lazyxla's)
    met.clear_counters()
    assert met.counter_value("MarkStep") is None and met.metric_data("ExecuteTime") is not None
    met.clear_metrics()
    assert met.metric_names() == []
    xm.save({"w": model.weight, "step": 3}, tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt")
    assert state["step"] == 3 and torch.equal(state["w"], model.weight.cpu())


def test_compile_regions_run_closures_and_keep_their_promises(xla, dev):
    import torch_xla.core.xla_model as xm

    x = torch.ones(3, device=dev)
    seen = []

    @xla.compile(full_graph=True)
    def double(t):
        xm.add_step_closure(seen.append, args=("closure",))
        return t * 2

    assert torch.equal(double(x).cpu(), torch.full((3,), 2.0)) and seen == ["closure"]
    with pytest.raises(lazyxla.CompileRegionError), xla.compile(full_graph=True):
        (x + 1).sum().item()
    with xla.step():
        y = x + 1
    assert torch.equal(y.cpu(), torch.full((3,), 2.0))


def test_rng_state_round_trips(xla, dev):
    import torch_xla.core.xla_model as xm

    xla.manual_seed(123)
    first = torch.rand(3, device=dev).cpu()
    xm.set_rng_state(123)
    assert torch.equal(torch.rand(3, device=dev).cpu(), first)
    state = xm.get_rng_state()
    a = torch.rand(3, device=dev).cpu()
    xm.set_rng_state(state)
    assert torch.equal(torch.rand(3, device=dev).cpu(), a) and not torch.equal(a, first)
    with xm.fork_rng():
        torch.rand(3, device=dev)
    assert xm.get_rng_state() == (state + (1 << 64))  # one draw after restoring `state`


def test_mp_device_loader_marks_each_step_and_fixes_the_batch_size(xla, dev):
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.parallel_loader as pl
    import torch_xla.utils.utils as xu

    data = [(torch.full((4, 2), float(i)), torch.arange(4)) for i in range(3)] + [(torch.zeros(2, 2), torch.arange(2))]
    met.clear_counters()
    loader = pl.MpDeviceLoader(data, dev)
    batches = list(loader)
    assert len(loader) == 4 and len(batches) == 4 and met.counter_value("MarkStep") == 5  # every next()
    assert all(x.device == dev and y.device == dev for x, y in batches)
    assert [x.cpu()[0, 0].item() for x, _ in batches[:3]] == [0.0, 1.0, 2.0]
    fixed = list(pl.MpDeviceLoader(data, dev, fixed_batch_size=True))
    assert len(fixed) == 3
    para = pl.ParallelLoader(xu.SampleGenerator(data=(torch.ones(2),), sample_count=3), [dev])
    assert len(list(para.per_device_loader(dev))) == 3 and para.per_device_samples() == 3


def test_set_replication_checks_what_torch_xla_checks(xla, dev):
    import torch_xla.core.xla_model as xm

    xm.set_replication(dev, xm.get_xla_supported_devices())  # what accelerate's PartialState calls
    xm.set_replication(str(dev), [])  # no replication
    with pytest.raises(RuntimeError, match="not a lazyxla device"):
        xm.set_replication("cpu", xm.get_xla_supported_devices())
    with pytest.raises(RuntimeError, match="every device of the process"):
        xm.set_replication(dev, [*xm.get_xla_supported_devices(), "lazyxla:7"])


def test_fetch_gradients_aliases_the_gradients_accelerate_all_reduces_in_place(xla, dev):
    import torch_xla.core.xla_model as xm

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)).to(dev)
    model[0].bias.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(4, 3, device=dev)).sum().backward()
    grads = xm._fetch_gradients(opt)
    with_grad = [p for p in model.parameters() if p.grad is not None]
    assert len(grads) == len(with_grad) == 3
    before = [p.grad.cpu() for p in with_grad]
    for g in grads:  # accelerate: xm.all_reduce("sum", grads, scale=1 / world) reduces these in place
        g.mul_(0.5)
    for p, b in zip(with_grad, before):
        torch.testing.assert_close(p.grad.cpu(), b * 0.5)


def test_maybe_convert_to_cpu_computes_in_one_program_and_keeps_structure(xla, dev):
    import torch_xla.core.xla_model as xm

    w = torch.ones(2, 2, device=dev) * 3
    b = w.sum(0)
    data = {"w": w, "again": w, "nested": [b, (b + 1, "text")], "n": 4}
    executions = lazyxla.metrics.counters()["executions"]
    cpu = xm._maybe_convert_to_cpu(data)
    assert lazyxla.metrics.counters()["executions"] == executions + 1  # one program for every pending tensor
    assert cpu["w"].device.type == "cpu" and torch.equal(cpu["w"], torch.full((2, 2), 3.0))
    assert cpu["again"] is cpu["w"] and cpu["n"] == 4  # a tensor found twice is one CPU tensor
    assert isinstance(cpu["nested"][1], tuple) and cpu["nested"][1][1] == "text"
    assert torch.equal(cpu["nested"][1][0], torch.full((2,), 7.0))
    pending = {"x": w * 2}
    assert xm._maybe_convert_to_cpu(pending, convert=False) is pending
    assert lazyxla.metrics.counters()["executions"] == executions + 2  # computed all the same
    assert pending["x"].device == dev


def test_save_and_do_on_ordinals_compute_on_the_replicas_that_do_not_write(xla, dev, tmp_path, monkeypatch):
    import torch_xla.core.xla_model as xm

    monkeypatch.setattr(xm, "is_master_ordinal", lambda local=True: False)
    executions = lazyxla.metrics.counters()["executions"]
    xm.save({"w": torch.ones(3, device=dev) * 2}, tmp_path / "ckpt.pt")
    assert not (tmp_path / "ckpt.pt").exists()
    assert lazyxla.metrics.counters()["executions"] == executions + 1  # the writer's program, run here too
    xm.save({"w": torch.ones(3, device=dev) * 2}, tmp_path / "ckpt.pt", master_only=False)
    assert torch.equal(torch.load(tmp_path / "ckpt.pt")["w"], torch.full((3,), 2.0))
    seen = []
    assert xm.do_on_ordinals(seen.append, (torch.ones(2, device=dev) * 5,), ordinals=(1,)) is None and not seen
    assert lazyxla.metrics.counters()["executions"] == executions + 3  # computed on ordinal 0 all the same
    xm.do_on_ordinals(seen.append, (torch.ones(2, device=dev) * 5,))
    assert seen[0].device.type == "cpu" and torch.equal(seen[0], torch.full((2,), 5.0))


def test_save_into_a_missing_folder_raises_as_torch_save(xla, dev, tmp_path):
    import torch_xla.core.xla_model as xm

    path = tmp_path / "missing" / "ckpt.pt"
    with pytest.raises(RuntimeError) as reference:
        torch.save({"w": torch.ones(2)}, path)
    with pytest.raises(RuntimeError) as ours:
        xm.save({"w": torch.ones(2, device=dev)}, path)
    assert str(ours.value).startswith(str(reference.value)), (str(ours.value), str(reference.value))


def test_mp_device_loader_names_the_dataset_accelerate_checkpoints_read(xla, dev):
    import torch_xla.distributed.parallel_loader as pl

    dataset = [torch.ones(2)] * 4
    loader = torch.utils.data.DataLoader(dataset, batch_size=2)
    assert pl.MpDeviceLoader(loader, dev).dataset is dataset


def test_amp_and_the_xla_backend(xla, dev):
    import torch.distributed as dist
    import torch_xla.distributed.xla_backend  # noqa: F401
    from torch_xla.amp import autocast, syncfree

    layer = torch.nn.Linear(4, 4).to(dev)
    with autocast(dev):
        assert layer(torch.randn(2, 4, device=dev)).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="XLA device"):
        autocast("cpu")
    opt = syncfree.SGD(layer.parameters(), lr=1.0)
    layer(torch.randn(2, 4, device=dev)).sum().backward()
    before = layer.weight.cpu()
    opt.step(found_inf=torch.ones((), device=dev))
    assert torch.equal(layer.weight.cpu(), before)  # skipped
    opt.step(found_inf=torch.zeros((), device=dev))
    assert not torch.equal(layer.weight.cpu(), before)
    assert "xla" in dist.Backend.backend_list


def test_fallbacks_are_counted_under_torch_xla_names(xla, dev):
    import torch_xla.debug.metrics as met

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback warning (once per op and process)
        torch.histc(torch.randn(8, device=dev), bins=4).cpu()  # histc has no lowering: it runs on the CPU
    assert met.counter_value("aten::histc") == 1
    assert "Counter: aten::histc" in met.short_metrics_report()


def _unsupported_calls(dev):
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.parallel_loader as pl
    import torch_xla.runtime as xr

    x = torch.ones(2, device=dev)
    return {
        "xla_model.send": (lambda: xm.send(x, 1), "lazyxla.collective_permute"),
        "xla_model.get_stablehlo() without tensors": (lambda: xm.get_stablehlo(), "lazyxla.debug.stablehlo_text"),
        "collective_broadcast(groups=...)": (lambda: xm.collective_broadcast([x], groups=[[0]]), "lazyxla.broadcast"),
        "initialize_cache(readonly=True)": (lambda: xr.initialize_cache("/tmp", readonly=True), "lazyxla.config"),
        "ParallelLoader over 2 devices": (lambda: pl.ParallelLoader([], [dev, dev]), "xmp.spawn"),
    }


def test_unsupported_functions_raise_naming_the_lazyxla_alternative(xla, dev):
    for what, (call, alternative) in _unsupported_calls(dev).items():
        with pytest.raises(NotImplementedError) as info:
            call()
        assert what in str(info.value) and alternative in str(info.value), str(info.value)
    if lazyxla.platform() == "cpu":
        import torch_xla.core.xla_model as xm

        with pytest.raises(NotImplementedError, match="get_memory_info.*memory_stats"):
            xm.get_memory_info(dev)


def test_xmp_spawn_runs_one_replica_in_process(xla, monkeypatch):
    import torch_xla.distributed.xla_multiprocessing as xmp

    for name in ("PJRT_DEVICE", "CPU_NUM_DEVICES", "GPU_NUM_DEVICES", "TPU_NUM_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    assert xmp.default_nprocs() == (1, False)
    assert xmp.spawn(lambda i, a: (i, a), args=("x",)) == (0, "x")
    ran = []  # join=False: runs and joins, then returns None (torch_xla's PJRT spawn; Lightning's launcher)
    assert xmp.spawn(lambda i, a: ran.append((i, a)), args=("x",), join=False) is None and ran == [(0, "x")]
    monkeypatch.setenv("CPU_NUM_DEVICES", "3")
    assert xmp.default_nprocs() == (3, True)
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    monkeypatch.setenv("TPU_NUM_DEVICES", "4")
    assert xmp.default_nprocs() == (4, False)
    with pytest.raises(ValueError, match="nprocs"):
        xmp.spawn(print, nprocs=0)


def test_every_public_function_has_an_example(xla):
    import pkgutil

    import lazyxla.compat.torch_xla as package

    modules = [package] + [
        importlib.import_module(m.name) for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
    ]
    missing = []
    for module in modules:
        for name, obj in vars(module).items():
            if name.startswith("_") or not callable(obj) or getattr(obj, "__module__", None) != module.__name__:
                continue
            if "Example" not in (inspect.getdoc(obj) or ""):
                missing.append(f"{module.__name__}.{name}")
    assert not missing, missing


def test_docs_mention_every_module():
    text = (ROOT / "docs" / "migrating-from-torch_xla.md").read_text()
    for name in ("xla_model", "runtime", "parallel_loader", "xla_multiprocessing", "spmd", "metrics", "amp"):
        assert name in text
    assert textwrap.dedent("python -m lazyxla.run") in text
