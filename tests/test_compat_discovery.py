"""How libraries discover torch_xla, with the compatibility layer installed: ``importlib.metadata`` answers the
``torch_xla`` distribution's version (never over a real one), and ``torch_xla._internal`` answers what Lightning
asks (``tpu.num_available_devices``), reading the host's TPU hardware as torch_xla does."""

from __future__ import annotations

import importlib.metadata as md

import pytest
from packaging.version import Version

import lazyxla.compat as compat


@pytest.fixture
def xla():
    assert compat.install()
    import torch_xla

    yield torch_xla
    compat.uninstall()


def test_metadata_answers_the_api_version_only_while_installed(xla):
    assert md.version("torch_xla") == md.version("torch-xla") == xla.__version__
    assert Version(md.version("torch_xla")).release == tuple(int(p) for p in compat.API_VERSION.split("."))
    assert Version(md.version("torch_xla")) >= Version("2.5")  # Lightning's newest gate
    assert md.distribution("torch_xla").metadata["Name"] == "torch_xla"
    assert "torch_xla" not in [d.metadata["Name"] for d in md.distributions()]  # listings stay truthful
    compat.uninstall()
    with pytest.raises(md.PackageNotFoundError):
        md.version("torch_xla")


def test_metadata_never_shadows_a_real_distribution(xla, tmp_path, monkeypatch):
    info = tmp_path / "torch_xla-9.9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_xla\nVersion: 9.9.9\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert md.version("torch_xla") == "9.9.9"


def _fake_pci(root, devices: list[tuple[str, str]]):
    for i, (vendor, device) in enumerate(devices):
        folder = root / f"0000:00:0{i}.0"
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(vendor + "\n")
        (folder / "device").write_text(device + "\n")
    return str(root)


def test_tpu_off_a_tpu_host(xla, tmp_path, monkeypatch):
    from torch_xla._internal import tpu

    monkeypatch.setattr(tpu, "_PCI_DEVICES", _fake_pci(tmp_path, [("0x8086", "0x005e"), ("0x1ae0", "0x9999")]))
    for name in ("PJRT_DEVICE", "CPU_NUM_DEVICES", "GPU_NUM_DEVICES", "TPU_NUM_DEVICES", "TPU_SKIP_MDS_QUERY"):
        monkeypatch.delenv(name, raising=False)
    assert tpu.num_available_chips() == 0
    assert tpu.num_available_devices() == tpu.num_local_processes() == 1  # lazyxla's one device per process
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    assert tpu.num_available_devices() == 2  # what xmp.spawn(nprocs=None) starts
    with pytest.raises(OSError, match="no TPU chips"):
        tpu.get_tpu_env()
    assert tpu.get_worker_ips() == ["localhost"] and tpu.num_tpu_workers() == 1


@pytest.mark.parametrize(("accelerator", "cores"), [("v4-8", 1), ("v3-8", 2)])
def test_tpu_on_a_tpu_host_described_by_variables(xla, tmp_path, monkeypatch, accelerator, cores):
    from torch_xla._internal import tpu

    chips = [("0x1ae0", "0x005e")] * 4 + [("0x1ae0", "0x1234")]
    monkeypatch.setattr(tpu, "_PCI_DEVICES", _fake_pci(tmp_path, chips))
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", accelerator)
    monkeypatch.setenv("TPU_PROCESS_BOUNDS", "1,2,1")
    assert tpu.num_available_chips() == 4
    assert tpu.version() == int(accelerator[1]) and tpu.get_tpu_type() == accelerator.split("-")[0]
    assert tpu.num_available_devices() == 4 * cores
    assert tpu.num_local_processes() == 2  # capped by the process bounds
    assert tpu.MeshShape.from_string("2,2,1").size == 4


def test_internal_utils_and_missing_names(xla):
    from torch_xla._internal import pjrt, tpu, utils

    assert utils.parse_xla_device("CPU:1") == ("CPU", 1) and utils.parse_xla_device("xla:1") is None
    assert callable(pjrt.spawn) and callable(pjrt.run_multiprocess)
    with pytest.raises(AttributeError, match="compatibility layer does not provide it"):
        pjrt.no_such_function  # noqa: B018
    assert tpu.__name__ == "lazyxla.compat.torch_xla._internal.tpu"  # one module under both names


def test_lightning_finds_torch_xla_and_its_devices(xla):
    reason = "Lightning is pinned in requirements.txt"
    xla_module = pytest.importorskip("lightning.fabric.accelerators.xla", reason=reason)
    from lightning_utilities.core.imports import RequirementCache

    assert RequirementCache("torch_xla>=2.5") and xla_module._using_pjrt()
    assert xla_module.XLAAccelerator.auto_device_count() >= 1
