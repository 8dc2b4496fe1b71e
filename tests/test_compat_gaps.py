"""The smaller parts of torch_xla's surface: env var names, differentiable collectives, metrics under torch_xla's
names and layout, metrics_compare_utils, the spmd.xla_sharding path, per-key input sharding, torch_xla.step()'s
step markers and the profiler's capture client.

The collectives' gradients are checked under two real replicas (``xmp.spawn`` with ``CPU_NUM_DEVICES=2``, a
subprocess) against gradients worked out by hand; per-key input sharding runs over 4 CPU devices in SPMD mode
(a subprocess). The rest runs in this process.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import warnings

import pytest
import torch

import lazyxla
import lazyxla.compat as compat
from tests.util import run_python


@pytest.fixture
def xla():
    """The compatibility layer installed in this process (removed again afterwards)."""
    assert compat.install()
    import torch_xla

    yield torch_xla
    compat.uninstall()


# --- torch_xla.core.xla_env_vars ---------------------------------------------------------------------


def test_env_var_constants_name_the_variables(xla):
    import torch_xla.core.xla_env_vars as xenv

    assert xenv.PJRT_DEVICE == "PJRT_DEVICE" and xenv.CPU_NUM_DEVICES == "CPU_NUM_DEVICES"
    assert xenv.TPU_MESH_CTLER_ADDR == "TPU_MESH_CONTROLLER_ADDRESS"  # torch_xla's one abbreviated name
    assert xenv.TPU_MESH_CTLER_PORT == "TPU_MESH_CONTROLLER_PORT"
    constants = {k: v for k, v in vars(xenv).items() if k.isupper()}
    # torch_xla's 30 names today, and 14 of earlier releases that libraries still read: the GPU ones and the XRT
    # runtime's (their values name XRT_* variables, e.g. HOST_ORDINAL)
    assert len(constants) == 44
    assert xenv.HOST_ORDINAL == "XRT_HOST_ORDINAL" and xenv.GPU_NUM_DEVICES == "GPU_NUM_DEVICES"
    xrt = {k: v for k, v in constants.items() if v.startswith("XRT_")}
    renamed = {"MP_DEVICE": "MULTI_PROCESSING_DEVICE", "SERVICE_ADDRESS": "MESH_SERVICE_ADDRESS"}
    renamed |= {"LOCAL_ORDINAL": "SHARD_LOCAL_ORDINAL", "ORDINAL": "SHARD_ORDINAL"}
    assert len(xrt) == 12 and all(v == "XRT_" + renamed.get(k, k) for k, v in xrt.items()), xrt
    assert all(k == v for k, v in constants.items() if not k.startswith("TPU_MESH_CTLER") and k not in xrt)


# --- torch_xla.core.functions ------------------------------------------------------------------------

FUNCTIONS_SCRIPT = r"""
import json, sys
import torch
import torch_xla
import torch_xla.core.functions as xf
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.runtime as xr


def leaf(values, dev):
    return torch.tensor(values, dtype=torch.float32, device=dev).requires_grad_()


def grad_of(fn, x, weights):
    out = fn(x)
    (out * weights).sum().backward()
    return out.detach().cpu().tolist(), x.grad.cpu().tolist()


def _mp_fn(index):
    dev = torch_xla.device()
    r = xr.global_ordinal()
    # each replica weighs its output differently (its own loss differs from the other's); not 1: a Python 0 or 1
    # stays a constant in the program, other numbers are its inputs, and every replica must run the same program
    c = float(r + 2)
    met.clear_all()
    res = {"rank": r, "world": xr.world_size()}
    res["sum"] = grad_of(lambda x: xf.all_reduce(xm.REDUCE_SUM, x, scale=0.5), leaf([1.0 + r, 2.0, 3.0], dev),
                         torch.full((3,), c, device=dev))
    res["mul"] = grad_of(lambda x: xf.all_reduce(xm.REDUCE_MUL, x), leaf([2.0 + r, 0.0, -1.0], dev),
                         torch.full((3,), c, device=dev))
    res["max"] = grad_of(lambda x: xf.all_reduce(xm.REDUCE_MAX, x), leaf([1.0 + 3 * r, 5.0 - 3 * r], dev),
                         torch.full((2,), c, device=dev))
    res["gather"] = grad_of(lambda x: xf.all_gather(x, dim=0), leaf([[1.0 + r, 2.0]], dev),
                            torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=dev) * c)
    scatter = lambda x: xf.reduce_scatter(xm.REDUCE_SUM, x, 2.0, 0, 2)
    res["scatter"] = grad_of(scatter, leaf([1.0 + r, 2.0, 3.0, 4.0], dev), torch.full((2,), c, device=dev))
    res["layer"] = grad_of(xf.AllReduceSumLayer.apply, leaf([1.0, 2.0], dev), torch.full((2,), c, device=dev))
    weight = torch.arange(12, dtype=torch.float32).reshape(3, 4)  # N=3 x (Ko=2 * world=2)
    x = (torch.arange(8, dtype=torch.float32).reshape(4, 2) + 10 * r)  # this replica's own x: 4 x M=2
    mm = xf.distributed_mm(weight[:, 2 * r:2 * r + 2].to(dev), x.to(dev))
    res["mm"] = [mm.cpu().tolist(), (weight @ x).tolist()]
    torch.manual_seed(0)
    batch = torch.randn(8, 3)
    bn = xf.SyncBatchNorm(3).to(dev)
    out = bn(batch[4 * r:4 * r + 4].to(dev))
    ref = torch.nn.BatchNorm1d(3)
    res["bn"] = [out.detach().cpu().tolist(), ref(batch)[4 * r:4 * r + 4].tolist(),
                 bn.running_mean.cpu().tolist(), ref.running_mean.tolist()]
    res["fallbacks"] = met.executed_fallback_ops()
    with open(f"result_{r}.json", "w") as f:  # one file per replica: their prints share a pipe
        json.dump(res, f)


if __name__ == "__main__":
    xmp.spawn(_mp_fn, args=())
"""


def _replica_results(folder) -> dict[int, dict]:
    rows = [json.loads(path.read_text()) for path in sorted(folder.glob("result_*.json"))]
    return {row["rank"]: row for row in rows}


def _lazyxla_run(tmp_path, name: str, text: str, devices: int, timeout: int):
    """``python -m lazyxla.run`` of the script ``text`` over ``devices`` CPU devices; it must exit 0."""
    (tmp_path / name).write_text(text)
    proc = run_python(["-m", "lazyxla.run", name], tmp_path, timeout=timeout, CPU_NUM_DEVICES=str(devices))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]
    return proc


def test_differentiable_collectives_under_two_replicas(tmp_path):
    proc = _lazyxla_run(tmp_path, "functions_2.py", FUNCTIONS_SCRIPT, devices=2, timeout=300)
    results = _replica_results(tmp_path)
    assert sorted(results) == [0, 1], proc.stdout[-2000:]
    for r, res in results.items():
        c = r + 2.0
        assert res["world"] == 2 and res["fallbacks"] == []
        # SUM: out = 0.5 * (x0 + x1); this replica's loss c * sum(out): d/dx_r = 0.5 * c (no communication)
        out, grad = res["sum"]
        assert out == [0.5 * (1 + 2), 0.5 * 4, 0.5 * 6] and grad == [0.5 * c] * 3
        # MUL: out = x0 * x1; d/dx_r = c * x_other, and 0 where x_r is 0 (torch_xla's rule)
        out, grad = res["mul"]
        other = [2.0 + (1 - r), 0.0, -1.0]
        assert out == [6.0, 0.0, 1.0] and grad == [c * other[0], 0.0, c * other[2]]
        # MAX: x0 = [1, 5], x1 = [4, 2]: out = [4, 5]; the gradient goes where x_r is the maximum
        out, grad = res["max"]
        assert out == [4.0, 5.0] and grad == ([0.0, c] if r == 0 else [c, 0.0])
        # all_gather: out = [[1, 2], [2, 2]]; d/dx_r = row r of the weights
        out, grad = res["gather"]
        assert out == [[1.0, 2.0], [2.0, 2.0]] and grad == [[c * (2 * r + 1), c * (2 * r + 2)]]
        # reduce_scatter (scale 2): out_r = 2 * (x0 + x1)[2r:2r+2]; d/dx_r = 2c in slice r, 0 elsewhere
        out, grad = res["scatter"]
        assert out == [2.0 * 3, 2.0 * 4] if r == 0 else out == [2.0 * 6, 2.0 * 8]
        assert grad == ([2 * c, 2 * c, 0.0, 0.0] if r == 0 else [0.0, 0.0, 2 * c, 2 * c])
        # AllReduceSumLayer: the gradient of both replicas' losses: (2 + 3) per element
        out, grad = res["layer"]
        assert out == [2.0, 4.0] and grad == [5.0, 5.0]
        got, want = res["mm"]
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want))
        out, ref, running, ref_running = res["bn"]
        torch.testing.assert_close(torch.tensor(out), torch.tensor(ref), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(torch.tensor(running), torch.tensor(ref_running), rtol=1e-5, atol=1e-6)


def test_differentiable_collectives_in_one_replica(xla, dev):
    import torch_xla.core.functions as xf
    import torch_xla.core.xla_model as xm

    x = torch.tensor([1.0, -2.0, 3.0], device=dev, requires_grad=True)
    (xf.all_reduce(xm.REDUCE_SUM, x * x, scale=3.0) * 2).sum().backward()
    assert x.grad.cpu().tolist() == [12.0, -24.0, 36.0]  # 2 * 3 * 2x
    y = torch.tensor([[1.0, 2.0]], device=dev, requires_grad=True)
    (xf.all_gather(y, dim=1) ** 2).sum().backward()
    assert y.grad.cpu().tolist() == [[2.0, 4.0]]
    with pytest.raises(RuntimeError, match="only SUM"):
        xf.reduce_scatter(xm.REDUCE_MAX, x, 1.0, 0, 1)
    with pytest.raises(ValueError, match="SyncBatchNorm"):
        xf.SyncBatchNorm(4)(torch.ones(2, 3, device=dev))
    assert lazyxla.metrics.counters()["compiles"] <= 3


# --- metrics under torch_xla's names -----------------------------------------------------------------


def test_step_counts_two_mark_steps_and_syncs_after_an_error(xla, dev):
    import torch_xla.debug.metrics as met

    met.clear_all()
    with xla.step():
        a = torch.ones(3, device=dev) * 2
    assert met.counter_value("MarkStep") == 2  # one entering, one leaving: as torch_xla's sync() calls
    executions = lazyxla.metrics.counters()["executions"]
    with pytest.raises(RuntimeError, match="inside the step"), xla.step():
        b = a + 1
        raise RuntimeError("inside the step")
    assert met.counter_value("MarkStep") == 4
    assert lazyxla.metrics.counters()["executions"] == executions + 1  # what the failed step recorded ran
    assert b.cpu().tolist() == [3.0] * 3 and lazyxla.metrics.counters()["executions"] == executions + 1
    xla.sync()
    assert met.counter_value("MarkStep") == 5


def test_metrics_under_torch_xla_names_come_from_lazyxla_metrics(xla, dev):
    import torch_xla.debug.metrics as met

    met.clear_all()
    x, y = torch.randn(4, 4).to(dev), torch.randn(4).to(dev)
    first = (x @ y).sum()
    xla.sync()
    value = (x @ y).sum().item()
    assert value == pytest.approx(first.item())
    counters, timers = lazyxla.metrics.counters(), lazyxla.metrics.timers()
    assert met.counter_value("UncachedCompile") == counters["compiles"] >= 1
    assert met.counter_value("CachedCompile") == counters["cache_hits"] >= 1  # the second sum
    assert met.counter_value("MarkStep") == 1
    to_dev, from_dev = met.metric_data("TransferToDeviceTime"), met.metric_data("TransferFromDeviceTime")
    assert to_dev[0] == counters["host_to_device"] == 2 and from_dev[0] == counters["device_to_host"] == 2
    assert to_dev[1] == pytest.approx(timers["transfer_to_device"]["total_s"] * 1e9)
    assert timers["transfer"]["count"] == 4  # lazyxla's own timer still counts both directions
    assert met.metric_data("ExecuteTime")[0] == timers["execute"]["count"] == counters["executions"]
    assert met.executed_fallback_ops() == ["aten::_local_scalar_dense"]  # .item(): a host read, as in torch_xla
    assert met.counter_value("aten::_local_scalar_dense") == counters["scalar_reads"] == 2
    short = met.short_metrics_report()
    for name in ("Metric: ExecuteTime", "Metric: TransferToDeviceTime", "Metric: TransferFromDeviceTime"):
        assert name in short
    assert "Counter: CachedCompile" in short and "Counter: aten::_local_scalar_dense" in short
    assert "Counter: compiles" not in short and "Metric: transfer" not in short
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback warning (once per op and process)
        torch.histc(torch.randn(8, device=dev), bins=4).cpu()  # histc has no lowering: it runs on the CPU
    assert met.executed_fallback_ops() == ["aten::_local_scalar_dense", "aten::histc"]
    met.clear_counters()
    assert met.executed_fallback_ops() == [] and met.counter_value("MarkStep") is None


def test_metrics_report_is_in_torch_xla_layout_and_parses(xla, dev):
    import torch_xla.debug.metrics as met
    import torch_xla.debug.metrics_compare_utils as mcu

    met.clear_all()
    results = []
    for _ in range(3):
        results.append((torch.arange(6.0).to(dev) * 3).sum())
        xla.sync()
    report = met.metrics_report()
    assert report.startswith("Metric: ") and "Counter: MarkStep\n  Value: 3\n" in report
    points = mcu.parse_metrics_report(report)
    counters, timers = lazyxla.metrics.counters(), lazyxla.metrics.timers()
    assert points["MarkStep__Value"] == 3 and points["CachedCompile__Value"] == counters["cache_hits"] == 2
    assert points["ExecuteTime__TotalSamples"] == 3
    assert points["ExecuteTime__Accumulator_sec"] == pytest.approx(timers["execute"]["total_s"], abs=2e-6)
    assert points["ExecuteTime__Percentile_99_sec"] == pytest.approx(timers["execute"]["max_s"], abs=2e-6)
    # three tensors moved to the device (each program's packed Python scalar, the 3, goes with the call: its bytes
    # count, its copy is not timed apart)
    assert points["TransferToDeviceTime__TotalSamples"] == 3
    assert met.metric_data("OutboundData")[:2] == (6, 3 * (6 * 4 + 8))  # bytes: float32[6] thrice, int64/f64 scalars
    assert "CreateXlaTensor__Value" not in points  # torch_xla's C++ counters have no lazyxla source: absent
    met.clear_metrics()
    assert "Metric:" not in met.metrics_report() and met.metric_names() == []


# --- torch_xla.debug.metrics_compare_utils ----------------------------------------------------------

REPORT_A = """Metric: CompileTime
  TotalSamples: 4
  Accumulator: 02m03s004ms
  Percentiles: 1%=05s; 5%=05s; 10%=05s; 20%=06s; 50%=30s; 80%=01m; 90%=01m; 95%=01m; 99%=01m01s500ms
Metric: InboundData
  TotalSamples: 10
  Accumulator: 2.5GB
  Percentiles: 1%=500KB; 5%=500KB; 10%=500KB; 20%=1.00MB; 50%=1.00MB; 80%=2.00MB; 90%=2.00MB; 95%=2.00MB; 99%=2MB
Counter: MarkStep
  Value: 40
Counter: CachedCompile
  Value: 36
"""
REPORT_B = REPORT_A.replace("Value: 40", "Value: 44").replace("TotalSamples: 10", "TotalSamples: 12")


def test_metrics_compare_utils_reads_durations_sizes_and_counters():
    import lazyxla.compat.torch_xla.debug.metrics_compare_utils as mcu

    points = mcu.parse_metrics_report("header text\n" + REPORT_A + "trailing text\n")
    assert points["CompileTime__Accumulator_sec"] == pytest.approx(123.004)
    assert points["CompileTime__Percentile_99_sec"] == pytest.approx(61.5)
    assert points["CompileTime__Percentile_80_sec"] == 60.0 and points["CompileTime__TotalSamples"] == 4.0
    assert points["InboundData__Accumulator_mb"] == pytest.approx(2500.0)
    assert points["InboundData__Percentile_1_mb"] == pytest.approx(0.5)
    assert points["MarkStep__Value"] == 40 and isinstance(points["MarkStep__Value"], int)
    assert len(points) == 2 * (2 + 9) + 2
    raw = mcu.parse_metrics_report(REPORT_A, dehumanize=False)
    assert raw["CompileTime__Accumulator_sec"] == (pytest.approx(123.004), "02m03s004ms")
    series = mcu.get_data_points_from_metrics_reports([REPORT_A, "Counter: Other\n  Value: 1\n", REPORT_B])
    assert series["MarkStep__Value"] == [40, None, 44] and series["Other__Value"] == [None, 1, None]


def test_compare_metrics_reports_what_left_its_history():
    import lazyxla.compat.torch_xla.debug.metrics_compare_utils as mcu

    history = mcu.get_data_points_from_metrics_reports([REPORT_A, REPORT_A, REPORT_B])
    assert mcu.compare_metrics(history, REPORT_A) == ""  # within mean + 2 stddev
    strict = mcu.compare_metrics(history, REPORT_B, config={"base_expression": "v == v_mean"})
    lines = strict.splitlines()
    assert [line.split()[0] for line in lines] == ["InboundData__TotalSamples", "MarkStep__Value"]
    assert lines[1] == (
        "MarkStep__Value failed its expression check. Expression: v == v_mean.  Mean: 41.333333333333336.  "
        "Stddev: 1.8856180831641267.  Actual Value: 44"
    )
    custom = {"base_expression": "v == v_mean", "MarkStep__Value_expression": "v <= 50"}
    assert mcu.compare_metrics(history, REPORT_B, config=custom).split()[0] == "InboundData__TotalSamples"
    fallback = REPORT_A + "Counter: aten::nonzero\n  Value: 7\n"
    assert mcu.compare_metrics(history, fallback) == "Found new aten counter: aten::nonzero__Value: 7\n"
    with pytest.raises(ValueError, match="Unknown metric_str format"):
        mcu.parse_metrics_report(REPORT_A.replace("2.5GB", "lots"))


# --- import paths and the data loader -----------------------------------------------------------------


def test_spmd_xla_sharding_is_the_spmd_module_surface(xla):
    import torch_xla.distributed.spmd as spmd
    import torch_xla.distributed.spmd.xla_sharding as xs
    from torch_xla.distributed.spmd.xla_sharding import Mesh, ShardingSpec, mark_sharding

    assert Mesh is spmd.Mesh and ShardingSpec is spmd.ShardingSpec and mark_sharding is spmd.mark_sharding
    assert set(xs.__all__) == set(spmd.__all__) and all(getattr(xs, n) is getattr(spmd, n) for n in spmd.__all__)


INPUT_SHARDING_DICT = r"""
import torch, torch_xla, lazyxla
import torch_xla.runtime as xr
import torch_xla.distributed.spmd as xs
import torch_xla.distributed.parallel_loader as pl
xr.use_spmd()
import os
assert os.environ["XLA_USE_SPMD"] == "1"  # torch_xla's use_spmd sets it; tests delete it in tearDownClass
mesh = xs.get_1d_mesh("data")
dev = torch_xla.device()
batch = {"x": torch.randn(8, 3), "y": torch.randn(2, 4, 3), "n": torch.arange(8)}
specs = {"x": xs.ShardingSpec(mesh, ("data", None)), "y": xs.ShardingSpec(mesh, (None, "data", None)),
         "n": xs.ShardingSpec(mesh, ("data",))}
got = next(iter(pl.MpDeviceLoader([batch], dev, input_sharding=specs)))
assert [lazyxla.spmd.get_sharding(got[k])[1] for k in "xyn"] == [("data", None), (None, "data", None), ("data",)]
assert all(torch.equal(got[k].cpu(), batch[k]) for k in batch)
plain = next(iter(pl.MpDeviceLoader([batch], dev, input_sharding={})))
assert all(lazyxla.spmd.get_sharding(plain[k]) is None and torch.equal(plain[k].cpu(), batch[k]) for k in batch)
try:
    next(iter(pl.MpDeviceLoader([batch], dev, input_sharding={"x": specs["x"]})))
except KeyError as e:
    assert "['y', 'n'] are missing from input_sharding" in str(e), e
else:
    raise AssertionError("no KeyError for the keys the dict does not name")
try:
    next(iter(pl.MpDeviceLoader([batch["x"]], dev, input_sharding=specs)))
except ValueError as e:
    assert "should be a dict" in str(e), e
else:
    raise AssertionError("no ValueError for a tensor batch with a dict of shardings")
# MarkShardingFunction (torch_xla.distributed.spmd.xla_sharding): a new sharded tensor, a sharded gradient
import torch_xla.distributed.spmd.xla_sharding as xss
x = torch.randn(8, 4).to(dev).requires_grad_()
y = xss.MarkShardingFunction.apply(x * 2, mesh, ("data", None))
assert lazyxla.spmd.get_sharding(y)[1] == ("data", None) and lazyxla.spmd.get_sharding(x) is None
(y * y).sum().backward()
assert torch.allclose(x.grad.cpu(), 8 * x.detach().cpu())
# torch.distributed's "xla" backend is not for SPMD mode, as in torch_xla
import torch.distributed as dist
import torch_xla.distributed.xla_backend
try:
    dist.init_process_group("xla", init_method="xla://")
except AssertionError as e:
    assert "SPMD" in str(e), e
else:
    raise AssertionError("the xla backend started in SPMD mode")
print("ok")
"""


def test_mp_device_loader_takes_a_sharding_per_dict_key_and_mark_sharding_function(tmp_path):
    proc = _lazyxla_run(tmp_path, "input_sharding_dict.py", INPUT_SHARDING_DICT, devices=4, timeout=180)
    assert proc.stdout.strip() == "ok", proc.stdout[-2000:]


# --- torch_xla.debug.profiler -------------------------------------------------------------------------

PROFILED = r"""
import sys, time, torch, torch_xla
import torch_xla.debug.profiler as xp
server = xp.start_server(int(sys.argv[1]))
assert xp.start_server(int(sys.argv[1])) is server  # jax runs one server per process: the same one again
x = torch.ones(64, 64, device=torch_xla.device())
end, compiled = time.time() + 20, False
while time.time() < end:
    with xp.Trace("profiled_matmul"):
        x = (x @ x) / 64.0
        torch_xla.sync(wait=True)
    if not compiled:  # the capture can start
        print("serving", flush=True)
        compiled = True
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_profiler_trace_captures_from_a_server_by_address(xla, tmp_path):
    import torch_xla.debug.profiler as xp

    try:
        xp._profiler_client()
    except ImportError as e:  # xprof is an optional dependency: without it, trace says how to get it
        assert "pip install xprof" in str(e)
        with pytest.raises(ImportError, match="pip install xprof"):
            xp.trace("localhost:1", str(tmp_path))
        return
    port = _free_port()
    script = tmp_path / "profiled.py"
    script.write_text(PROFILED)
    server = subprocess.Popen(
        [sys.executable, "-m", "lazyxla.run", str(script), str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout.readline().strip() == "serving"
        xp.trace(f"localhost:{port}", str(tmp_path / "logs"), duration_ms=1500, timeout_s=30, interval_s=1)
    finally:
        server.kill()
        server.wait()
    planes = list((tmp_path / "logs" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(planes) == 1 and b"profiled_matmul" in planes[0].read_bytes()


def test_profiler_trace_retries_until_its_timeout(xla, tmp_path, monkeypatch):
    import torch_xla.debug.profiler as xp

    calls = []

    class Client:  # stands in for xprof's client: unavailable twice, then captures
        @staticmethod
        def trace(addr, logdir, workers, dataset_ops, duration_ms, attempts, options):
            calls.append((addr, logdir, duration_ms, attempts, options))
            if len(calls) < 3:
                raise RuntimeError("UNAVAILABLE: no trace event was collected")

    monkeypatch.setattr(xp, "_profiler_client", lambda: Client)
    xp.trace("localhost:9012", tmp_path, duration_ms=10, num_tracing_attempts=2, delay_ms=5, interval_s=0)
    assert len(calls) == 3 and calls[0][:4] == ("localhost:9012", str(tmp_path), 10, 2)
    assert calls[0][4] == {"host_tracer_level": 2, "device_tracer_level": 1, "delay_ms": 5}
    calls.clear()
    with pytest.raises(RuntimeError, match="UNAVAILABLE"):
        xp.trace("localhost:9012", tmp_path, timeout_s=0, interval_s=1)
    assert len(calls) == 1
    seen = []
    monkeypatch.setattr(xp, "trace", lambda *a, **k: seen.append((a, k, threading.current_thread().name)))
    xp.trace_detached("localhost:9012", "/tmp/x", duration_ms=5).join(timeout=10)
    assert seen == [(("localhost:9012", "/tmp/x"), {"duration_ms": 5}, "torch_xla.debug.profiler.trace")]


def test_profiler_trace_errors_read_as_torch_xla_s(xla, tmp_path):
    import torch_xla.debug.profiler as xp

    with pytest.raises(RuntimeError, match="No profile started"):
        xp.stop_trace()
    xp.start_trace(str(tmp_path))
    try:
        with pytest.raises(RuntimeError, match="Only one profile may be run at a time"):
            xp.start_trace(str(tmp_path))
    finally:
        xp.stop_trace()
    assert list(tmp_path.glob("**/*.xplane.pb"))
