"""Cases of ``tests/test_xla_device.py``, run by pytest in a child process started as torch_xla users start
their scripts: ``CPU_NUM_DEVICES=2 python -m lazyxla.run -m pytest tests/xla_device_cases.py``. There lazyxla's
device is named ``xla`` (two fake CPU devices: ``xla:0`` and ``xla:1``), as PyTorch names the device once per
process. Each case compares with CPU eager PyTorch, in this process.

Not collected by the main test run (the file name does not start with ``test_``).
"""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F
import torch_xla
import torch_xla.amp
import torch_xla.core.xla_model as xm
from torch import nn

import lazyxla
import lazyxla.compat
from tests.util import assert_same

XLA0 = torch.device("xla", 0)
XLA1 = torch.device("xla", 1)


@pytest.fixture(autouse=True)
def _the_device_is_named_xla():
    assert lazyxla.compat.installed(), "these cases run under python -m lazyxla.run"
    assert lazyxla.device() == XLA0, "python -m lazyxla.run names the device 'xla'"


# ---- the device's names ---------------------------------------------------------------------------------

SPELLINGS = {
    "torch.device('xla')": (lambda: torch.device("xla"), None),
    "torch.device('xla:1')": (lambda: torch.device("xla:1"), 1),
    "torch.device('xla', 1)": (lambda: torch.device("xla", 1), 1),
    "torch_xla.device()": (lambda: torch_xla.device(), 0),
    "torch_xla.device(1)": (lambda: torch_xla.device(1), 1),
    "xm.xla_device()": (lambda: xm.xla_device(), 0),
    "xm.xla_device(1)": (lambda: xm.xla_device(1), 1),
    "lazyxla.device()": (lambda: lazyxla.device(), 0),
}


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_spelling_names_the_device(spelling):
    make, index = SPELLINGS[spelling]
    d = make()
    assert isinstance(d, torch.device) and d.type == "xla" and d.index == index
    x = torch.ones(2, device=d)
    assert x.device == torch.device("xla", index or 0)


def test_the_process_lists_its_devices_by_torch_xlas_names():
    assert torch_xla.devices() == [XLA0, XLA1] == lazyxla.devices()
    assert xm.get_xla_supported_devices() == ["xla:0", "xla:1"]
    assert torch.accelerator.current_accelerator().type == "xla"
    with pytest.raises(RuntimeError, match="lazyxla"):  # one name per process: PyTorch parses only 'xla' now
        torch.device("lazyxla")


# ---- factories ----------------------------------------------------------------------------------------------

FACTORIES = {
    "zeros": lambda d: torch.zeros(2, 3, device=d),
    "ones int32": lambda d: torch.ones(2, 3, dtype=torch.int32, device=d),
    "full": lambda d: torch.full((2, 2), 3.5, device=d),
    "arange": lambda d: torch.arange(1, 10, 2, device=d),
    "linspace": lambda d: torch.linspace(0, 1, 5, device=d),
    "eye": lambda d: torch.eye(3, device=d),
    "tensor": lambda d: torch.tensor([[1.5, 2.0], [3.0, -4.0]], device=d),
    "tensor bool": lambda d: torch.tensor([True, False], device=d),
    "as_tensor": lambda d: torch.as_tensor([1, 2, 3], device=d),
    "scalar_tensor": lambda d: torch.scalar_tensor(3, device=d),
    "empty then fill_": lambda d: torch.empty(4, device=d).fill_(2.0),
    "zeros_like": lambda d: torch.zeros_like(torch.ones(2, 2, device=d)),
    "new_ones": lambda d: torch.ones(1, device=d).new_ones(3, 2),
    "new_tensor device=": lambda d: torch.ones(1, device=d).new_tensor([4, 5], device=d),
}
DEVICES = {"'xla'": "xla", "'xla:1'": "xla:1", "torch.device('xla', 1)": XLA1}


@pytest.mark.parametrize("where", DEVICES)
@pytest.mark.parametrize("factory", FACTORIES)
def test_factories_make_tensors_on_the_device_they_name(factory, where):
    d = torch.device(DEVICES[where])
    got = FACTORIES[factory](DEVICES[where])
    assert got.device == torch.device("xla", d.index or 0)
    assert_same(got, FACTORIES[factory]("cpu"))


RANDOM = {
    "rand": lambda d: torch.rand(64, device=d),
    "randn": lambda d: torch.randn(8, 8, device=d),
    "randint": lambda d: torch.randint(3, 9, (64,), device=d),
    "randperm": lambda d: torch.randperm(10, device=d),
}


@pytest.mark.parametrize("factory", RANDOM)
def test_random_factories_draw_on_the_device_they_name(factory):
    for where, index in (("xla", 0), ("xla:1", 1)):
        got = RANDOM[factory](where)
        assert got.device == torch.device("xla", index)
        want = RANDOM[factory]("cpu")
        assert got.shape == want.shape and got.dtype == want.dtype
        values = got.cpu()
        if factory == "rand":
            assert values.min() >= 0 and values.max() < 1 and values.unique().numel() > 60
        elif factory == "randint":
            assert values.min() >= 3 and values.max() < 9
        elif factory == "randperm":
            assert sorted(values.tolist()) == list(range(10))


# ---- moving tensors and modules --------------------------------------------------------------------------


def test_to_moves_tensors_by_every_spelling():
    x = torch.randn(3, 4)
    a = x.to("xla")
    assert a.device == XLA0 and torch.equal(a.cpu(), x)
    assert a.to("xla") is a and a.to(torch.device("xla")) is a and a.to("xla:0") is a  # already there: itself
    b = x.to("xla:1")
    assert b.device == XLA1 and torch.equal(b.cpu(), x)
    c = x.to(device="xla", dtype=torch.float64)
    assert c.device == XLA0 and c.dtype == torch.float64 and torch.equal(c.cpu(), x.double())
    d = a.to("xla:1")  # one device to the other
    assert d.device == XLA1 and torch.equal(d.to("cpu"), x)
    e = x.to(b)  # the device and dtype of another tensor
    assert e.device == XLA1 and e.dtype == b.dtype
    assert torch.equal(torch.zeros(3, 4).copy_(a), x)
    assert torch.equal(torch.zeros(3, 4, device="xla").copy_(x).cpu(), x)


@pytest.mark.parametrize("where", ["xla", "xla:1"])
def test_module_to_moves_parameters_and_buffers(where):
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).eval()
    moved = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).eval()
    moved.load_state_dict(cpu.state_dict())
    moved.to(where)
    want = torch.device(where)
    assert {t.device for t in [*moved.parameters(), *moved.buffers()]} == {torch.device("xla", want.index or 0)}
    x = torch.randn(5, 4)
    assert_same(moved(x.to(where)), cpu(x))


def test_libraries_device_checks_see_xla():
    t = torch.arange(4.0, device="xla")
    assert t.device.type == "xla" and str(t.device) == "xla:0" and not t.is_cpu
    assert xm.is_xla_tensor(t) and not xm.is_xla_tensor(torch.arange(4.0))
    assert repr(t) == "tensor([0., 1., 2., 3.], device='xla:0')"
    assert torch.device(t.device.type, 0) == t.device  # accelerate's device comparison


# ---- tensors on different devices -------------------------------------------------------------------------


def test_mixing_with_cpu_tensors_raises_as_pytorch_does():
    a, cpu = torch.ones(3, device="xla"), torch.ones(3)
    for op in (lambda: a + cpu, lambda: cpu * a, lambda: torch.mm(a.view(3, 1), cpu.view(1, 3))):
        with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device.*xla:0 and cpu"):
            op()
    # a 0-dim CPU tensor is a scalar, as for CUDA
    assert_same(a * torch.tensor(2.5), torch.ones(3) * 2.5)


def test_mixing_the_two_devices_raises():
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device.*xla:0 and xla:1"):
        torch.ones(2, device="xla:0") + torch.ones(2, device="xla:1")


# ---- autocast ---------------------------------------------------------------------------------------------------


def test_autocast_with_device_type_xla():
    assert torch.amp.is_autocast_available("xla")
    assert torch.get_autocast_dtype("xla") == torch.bfloat16  # PyTorch's default for its XLA device type
    torch.manual_seed(0)
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    for dtype in (None, torch.bfloat16, torch.float16):
        with torch.autocast("xla", dtype=dtype):
            got = a.to("xla") @ b.to("xla")
            soft = got.softmax(-1)
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16):
            want = a @ b
        assert got.dtype == (dtype or torch.bfloat16) and soft.dtype == torch.float32
        torch.testing.assert_close(got.cpu(), want, rtol=1e-2, atol=1e-2)
    with torch_xla.amp.autocast(xm.xla_device()):
        assert (a.to("xla") @ b.to("xla")).dtype == torch.bfloat16


def test_grad_scaler_on_xla_equals_the_cpu():
    def step(device: str, scaler):
        torch.manual_seed(0)
        model = nn.Linear(6, 3).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(4, 6).to(device), torch.randn(4, 3).to(device)
        with torch.autocast(device, dtype=torch.float16):
            loss = F.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return model, float(scaler.get_scale())

    model, scale = step("xla", torch.amp.GradScaler("xla"))
    cpu, cpu_scale = step("cpu", torch.amp.GradScaler("cpu"))
    assert scale == cpu_scale == 65536.0
    for p, q in zip(model.parameters(), cpu.parameters()):
        assert_same(p, q.detach(), rtol=1e-3, atol=1e-3)


# ---- checkpoints ------------------------------------------------------------------------------------------------


def test_state_dict_round_trips_through_torch_save(tmp_path):
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    model.load_state_dict(cpu.state_dict())
    model.to("xla")
    torch.save(model.state_dict(), tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=True)
    assert {t.device for t in loaded.values()} == {XLA0}  # as torch_xla's tensors come back
    on_cpu = torch.load(tmp_path / "model.pt", weights_only=True, map_location="cpu")
    for name, t in cpu.state_dict().items():
        assert torch.equal(loaded[name].cpu(), t) and torch.equal(on_cpu[name], t)
    fresh = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2)).to("xla")
    fresh.load_state_dict(loaded)
    x = torch.randn(3, 4)
    assert_same(fresh(x.to("xla")), cpu(x))
    buffer = io.BytesIO()
    torch.save(fresh(x.to("xla")).detach(), buffer)  # a lone device tensor pickles through its CPU copy
    buffer.seek(0)
    assert_same(torch.load(buffer, weights_only=True), cpu(x))


# ---- training -----------------------------------------------------------------------------------------------------


def test_training_on_xla_equals_cpu_eager_and_compiles_once():
    def train(device: str):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        torch.manual_seed(1)
        batches = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(5)]
        losses, compiles = [], []
        for x, y in batches:
            loss = F.mse_loss(model(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            opt.zero_grad()
            if device == "xla":
                xm.mark_step()
                compiles.append(lazyxla.metrics.counters().get("compiles", 0))
            losses.append(loss.item())
        return model, losses, compiles

    model, losses, compiles = train("xla")
    cpu, cpu_losses, _ = train("cpu")
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), cpu.parameters()):
        assert p.device == XLA0
        assert_same(p, q.detach())
    assert compiles[2:] == [compiles[2]] * 3, f"steps 3-5 compiled again: {compiles}"


def test_torch_compile_and_export_on_the_xla_device():
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    model.load_state_dict(cpu.state_dict())
    model.to("xla")
    x = torch.randn(4, 8)
    out = torch.compile(model, backend="lazyxla")(x.to("xla"))
    out.sum().backward()
    cpu(x).sum().backward()
    assert_same(out, cpu(x))
    assert_same(model[0].weight.grad, cpu[0].weight.grad)
    state = torch.xla.get_rng_state()  # the device module is torch.<name>
    exported = lazyxla.export(lambda v: model(v) + torch.rand(2, device="xla"), (x,))
    assert torch.equal(torch.xla.get_rng_state(), state), "exporting draws no numbers from the device's stream"
    assert exported is not None


# ---- transformers and accelerate --------------------------------------------------------------------------------


@pytest.fixture
def accelerate_state():
    from accelerate.state import AcceleratorState  # imported by the cases that use it (accelerate loads slowly)

    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)


def test_transformers_training_arguments_take_the_xla_device(tmp_path):
    from transformers import TrainingArguments  # imported here: transformers loads slowly
    from transformers.training_args import ParallelMode

    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    assert args.device == XLA0 and args.device.type == "xla"
    assert args.parallel_mode == ParallelMode.TPU


def test_accelerate_takes_the_xla_device(accelerate_state):
    from accelerate import Accelerator, PartialState
    from accelerate.utils import DistributedType

    state = PartialState()
    assert state.device == XLA0 and state.distributed_type == DistributedType.XLA
    accelerator = Accelerator()
    assert accelerator.device.type == "xla"
    t = torch.arange(3.0, device=accelerator.device)
    gathered = accelerator.gather(t)  # accelerate's operations check the tensor's device type against the state's
    assert gathered.device == XLA0 and torch.equal(gathered.cpu(), torch.arange(3.0))


def _tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=50, n_positions=16, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def test_transformers_finds_tied_weights_through_the_xla_tensor_id():
    from transformers.modeling_utils import remove_tied_weights_from_state_dict
    from transformers.pytorch_utils import id_tensor_storage

    cpu = _tiny_gpt2()
    model = _tiny_gpt2().to("xla")
    # transformers asks torch_xla._XLAC._xla_get_tensor_id for 'xla' tensors (they have no storage pointer)
    assert id_tensor_storage(model.lm_head.weight) == id_tensor_storage(model.transformer.wte.weight)
    assert id_tensor_storage(model.lm_head.weight) != id_tensor_storage(model.transformer.wpe.weight)
    w = model.transformer.wpe.weight
    assert torch_xla._XLAC._xla_get_tensor_id(w.detach()) == torch_xla._XLAC._xla_get_tensor_id(w.t())
    assert torch_xla._XLAC._xla_get_tensor_id(w) != torch_xla._XLAC._xla_get_tensor_id(w.clone())
    kept = remove_tied_weights_from_state_dict(model.state_dict(), model)
    assert sorted(kept) == sorted(remove_tied_weights_from_state_dict(cpu.state_dict(), cpu))
    assert "lm_head.weight" not in kept


def test_save_pretrained_of_a_model_on_the_device(tmp_path):
    from transformers import GPT2LMHeadModel

    cpu = _tiny_gpt2()
    model = _tiny_gpt2().to("xla")
    # transformers' own spelling on XLA (Trainer's save_model): the state dict copied to the CPU in one program
    model.save_pretrained(tmp_path / "saved", state_dict=xm._maybe_convert_to_cpu(model.state_dict()))
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path / "saved")
    assert reloaded.lm_head.weight is reloaded.transformer.wte.weight
    for name, t in cpu.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], t), name
    # Without it too, unlike torch_xla's (huggingface/transformers#29608): a lazyxla storage answers data_ptr() with an
    # address that identifies it (frontend/storage.py), which safetensors groups tied tensors by
    model.save_pretrained(tmp_path / "direct")
    direct = GPT2LMHeadModel.from_pretrained(tmp_path / "direct")
    assert direct.lm_head.weight is direct.transformer.wte.weight
    for name, t in cpu.state_dict().items():
        assert torch.equal(direct.state_dict()[name], t), name


def _train_with_accelerate(mixed_precision: str):
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision=mixed_precision)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    dtypes = []
    model[0].register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    losses = []
    for x, y in _batches():
        loss = F.mse_loss(model(x.to(accelerator.device)), y.to(accelerator.device))
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        assert not opt.step_was_skipped
        losses.append(loss.item())
    return accelerator, model, losses, dtypes


def _batches():
    torch.manual_seed(1)
    return [(torch.randn(4, 8), torch.randn(4, 4)) for _ in range(3)]


def _train_on_cpu_with_autocast(dtype: torch.dtype, scale: bool):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=scale)
    losses = []
    for x, y in _batches():
        with torch.autocast("cpu", dtype=dtype):
            out = model(x)
        loss = F.mse_loss(out.float(), y)  # accelerate returns the prepared model's outputs in float32
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        losses.append(loss.item())
    return model, losses


@pytest.mark.parametrize(
    "mixed_precision, dtype, rtol", [("bf16", torch.bfloat16, 5e-3), ("fp16", torch.float16, 5e-4)]
)
def test_accelerate_mixed_precision_on_xla_equals_cpu_autocast(accelerate_state, mixed_precision, dtype, rtol):
    accelerator, model, losses, dtypes = _train_with_accelerate(mixed_precision)
    assert accelerator.native_amp and dtypes == [dtype] * 3, "accelerate's autocast ran the linear layers in " + str(
        dtypes
    )
    if mixed_precision == "fp16":  # accelerate scales the loss (its GradScaler for XLA on a CPU or TPU host)
        assert accelerator.scaler is not None and accelerator.scaler.get_scale() == 65536.0
    cpu, cpu_losses = _train_on_cpu_with_autocast(dtype, scale=mixed_precision == "fp16")
    torch.testing.assert_close(losses, cpu_losses, rtol=rtol, atol=rtol)
    for p, q in zip(model.parameters(), cpu.parameters()):
        assert_same(p, q.detach(), rtol=rtol, atol=rtol)
