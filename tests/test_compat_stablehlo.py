"""``torch_xla.stablehlo`` on lazyxla: ``torch.export`` programs converted to StableHLO, called, saved in
torch_xla's folder layout and loaded again; every result is compared with the same module run eagerly on the CPU.
The loaded folder is also run in a new process that has neither the model nor its ExportedProgram.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import lazyxla.compat as compat


@pytest.fixture
def shlo():
    """``torch_xla.stablehlo`` with the compatibility layer installed (removed again afterwards)."""
    assert compat.install()
    import torch_xla.stablehlo

    yield torch_xla.stablehlo
    compat.uninstall()


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.head(y.mean(dim=(2, 3)))


def _eval(model: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    model = model.eval()
    for name, b in model.named_buffers():  # BatchNorm statistics that are not the identity
        if name.endswith("running_mean"):
            b.copy_(torch.randn_like(b) * 0.1)
        elif name.endswith("running_var"):
            b.copy_(torch.rand_like(b) + 0.5)
    return model


@pytest.mark.parametrize("make,shape", [(MLP, (8, 16)), (ConvNet, (2, 3, 12, 12))], ids=["mlp", "convnet"])
def test_converted_program_equals_cpu_eager(shlo, make, shape):
    model = _eval(make())
    x = torch.randn(*shape)
    ep = torch.export.export(model, (x,))
    program = shlo.exported_program_to_stablehlo(ep)
    with torch.no_grad():
        want = model(x)
        got = program(x)
        other = torch.randn(*shape)  # a new input of the same shape: nothing of x is baked in
        got_other, want_other = program(other), model(other)
    assert got.device.type in ("lazyxla", "xla")
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_other.cpu(), want_other, rtol=1e-5, atol=1e-5)
    meta = program._bundle.stablehlo_funcs[0].meta
    params = [loc.name for loc in meta.input_locations if loc.type_ == shlo.VariableType.PARAMETER]
    assert set(params) <= set(model.state_dict())
    assert {"fc1.weight", "fc2.weight"} <= set(params) or {"conv.weight", "bn.running_var"} <= set(params)
    assert [loc.position for loc in meta.input_locations if loc.type_ == shlo.VariableType.INPUT_ARG] == [0]
    assert sorted(program._bundle.state_dict) == sorted(ep.state_dict)  # the weights are inputs, not constants


def test_text_is_stablehlo_from_lazyxla_lowering(shlo):
    model = _eval(ConvNet())
    program = shlo.exported_program_to_stablehlo(torch.export.export(model, (torch.randn(2, 3, 12, 12),)))
    text = program.get_stablehlo_text()
    assert "func.func public @main" in text
    assert "stablehlo.convolution" in text and "stablehlo.dot_general" in text
    # the weights are parameters of main (tensor<8x3x3x3xf32> is the conv's), not constants
    assert "tensor<8x3x3x3xf32>" in text.split("func.func public @main", 1)[1].split("{", 1)[0]
    blob = program.get_stablehlo_bytecode()
    assert blob.startswith(b"ML\xefR") and b"StableHLO_v" in blob[:64]  # a StableHLO portable artifact
    assert program._bundle.stablehlo_funcs[0].meta.stablehlo_version[0].isdigit()
    quiet = shlo.exported_program_to_stablehlo(
        torch.export.export(model, (torch.randn(2, 3, 12, 12),)),
        shlo.StableHLOExportOptions(include_human_readable_text=False),
    )
    assert quiet.get_stablehlo_text() is None


def test_save_load_call_equals_eager_and_the_layout_is_torch_xlas(shlo, tmp_path):
    model = _eval(MLP())
    x = torch.randn(8, 16)
    program = shlo.exported_program_to_stablehlo(torch.export.export(model, (x,)))
    program.save(tmp_path)
    assert sorted(os.listdir(tmp_path / "functions")) == ["forward.bytecode", "forward.meta", "forward.mlir"]
    assert sorted(os.listdir(tmp_path / "data")) == sorted(model.state_dict())
    assert os.listdir(tmp_path / "constants") == []
    meta = json.loads((tmp_path / "functions" / "forward.meta").read_text())
    assert meta["input_locations"][-1] == {"type_": "input_arg", "position": 0, "name": ""}
    loaded = shlo.StableHLOGraphModule.load(tmp_path)
    assert loaded._bundle.stablehlo_funcs[0].meta == program._bundle.stablehlo_funcs[0].meta
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).cpu(), model(x), rtol=1e-5, atol=1e-5)


def test_loaded_folder_runs_in_a_process_without_the_model(shlo, tmp_path):
    model = _eval(ConvNet())
    x = torch.randn(2, 3, 12, 12)
    shlo.save_as_stablehlo(torch.export.export(model, (x,)), tmp_path / "prog")
    torch.save({"x": x, "want": model(x).detach()}, tmp_path / "io.pt")
    script = textwrap.dedent(
        f"""
        import torch, lazyxla.compat
        lazyxla.compat.install()
        from torch_xla.stablehlo import StableHLOGraphModule
        io = torch.load({str(tmp_path / "io.pt")!r})
        got = StableHLOGraphModule.load({str(tmp_path / "prog")!r})(io["x"]).cpu()
        torch.testing.assert_close(got, io["want"], rtol=1e-5, atol=1e-5)
        print("ok", tuple(got.shape))
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ok (2, 5)" in run.stdout


def test_save_torch_model_as_stablehlo_and_weights_left_out(shlo, tmp_path):
    model = _eval(MLP())
    x = torch.randn(4, 16)
    import torch_xla

    torch_xla.save_torch_model_as_stablehlo(model, (x,), tmp_path / "full")
    with torch.no_grad():
        torch.testing.assert_close(shlo.StableHLOGraphModule.load(tmp_path / "full")(x).cpu(), model(x))
    options = shlo.StableHLOExportOptions(save_weights=False)
    shlo.save_torch_model_as_stablehlo(model, (x,), tmp_path / "bare", options)
    assert options.override_tracing_arguments is None  # the caller's options are not changed
    assert not os.path.exists(tmp_path / "bare" / "data")
    bare = shlo.StableHLOGraphModule.load(tmp_path / "bare")
    with pytest.raises(KeyError, match="fc1.weight.*save_weights=False"):
        bare(x)
    bare._bundle.state_dict.update({k: v.numpy() for k, v in model.state_dict().items()})
    with torch.no_grad():
        torch.testing.assert_close(bare(x).cpu(), model(x))
    ep = torch.export.export(model, (x,))
    assert (
        shlo.exported_program_to_stablehlo(ep, shlo.StableHLOExportOptions(export_weights=False))._bundle.state_dict
        == {}
    )


class DictModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, inputs, unused):
        e = self.emb(inputs["ids"])
        return e * inputs["scale"], {"sum": e.sum()}


def test_pytree_inputs_outputs_int64_and_unused_arguments(shlo, tmp_path):
    torch.manual_seed(0)
    model = DictModel()
    args = ({"ids": torch.tensor([[1, 2], [3, 9]]), "scale": torch.randn(2, 2, 4)}, torch.randn(3))
    program = shlo.exported_program_to_stablehlo(torch.export.export(model, args))
    meta = program._bundle.stablehlo_funcs[0].meta
    assert "int64" in [s.dtype for s in meta.input_signature]
    assert [(loc.position, sig.shape) for loc, sig in meta.unused_inputs] == [(2, [3])]  # flat position of `unused`
    program.save(tmp_path)
    for prog in (program, shlo.StableHLOGraphModule.load(tmp_path)):
        with torch.no_grad():
            (got, extra), (want, want_extra) = prog(*args), model(*args)
        torch.testing.assert_close(got.cpu(), want)
        torch.testing.assert_close(extra["sum"].cpu(), want_extra["sum"])


def test_bfloat16_weights_save_and_load(shlo, tmp_path):
    torch.manual_seed(0)
    model, x = nn.Linear(4, 2).to(torch.bfloat16), torch.randn(3, 4, dtype=torch.bfloat16)
    program = shlo.exported_program_to_stablehlo(torch.export.export(model, (x,)))
    program.save(tmp_path)
    with torch.no_grad():
        want = model(x).float()
        for prog in (program, shlo.StableHLOGraphModule.load(tmp_path)):
            got = prog(x).cpu()
            assert got.dtype == torch.bfloat16
            torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)  # bfloat16's resolution


def test_lifted_constants_and_buffers_are_state(shlo, tmp_path):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("offset", torch.arange(3.0), persistent=False)

        def forward(self, a):
            return a / torch.tensor(3.0) + self.offset

    model, x = M(), torch.randn(2, 3)
    program = shlo.exported_program_to_stablehlo(torch.export.export(model, (x,)))
    program.save(tmp_path)
    torch.testing.assert_close(shlo.StableHLOGraphModule.load(tmp_path)(x).cpu(), model(x))


def test_dynamic_batch_is_refused_with_the_dimension_named(shlo):
    batch = torch.export.Dim("batch")
    ep = torch.export.export(MLP(), (torch.randn(4, 16),), dynamic_shapes=({0: batch},))
    with pytest.raises(NotImplementedError, match=r"dynamic input dimensions \(x dimension 0 .*fixed shapes"):
        shlo.exported_program_to_stablehlo(ep)


def test_bad_inputs_raise_what_to_do(shlo):
    with pytest.raises(TypeError, match="ExportedProgram.*got a MLP.*save_torch_model_as_stablehlo"):
        shlo.exported_program_to_stablehlo(MLP())
    with pytest.raises(TypeError, match="ExportedProgram.*got a str"):
        shlo.save_as_stablehlo("model.pt", "/tmp/never-written")
    program = shlo.exported_program_to_stablehlo(torch.export.export(MLP(), (torch.randn(4, 16),)))
    with pytest.raises(ValueError, match=r"float32\[4, 16\], the call gave float32\[5, 16\].*fixed shapes"):
        program(torch.randn(5, 16))
    with pytest.raises(FileNotFoundError, match="no functions/ folder"):
        shlo.StableHLOGraphModule.load("/nonexistent-stablehlo-folder")


def test_meta_json_round_trip(shlo):
    meta = shlo.StableHLOFunctionMeta(
        name="forward",
        stablehlo_version="1.0.0",
        input_signature=[shlo.VariableSignature([2, 3], "float32", [0])],
        output_signature=[shlo.VariableSignature([], "int64")],
        input_locations=[shlo.InputLocation.parameter("parameter"), shlo.InputLocation.input_arg(0)],
        unused_inputs=[],
    )
    back = json.loads(json.dumps(meta, cls=shlo.StableHLOJSONSerializer), object_hook=shlo.stablehlo_obj_hook)
    assert back == meta  # a parameter named like an enum value stays a name
