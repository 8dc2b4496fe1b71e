"""PyTorch's tensor contract around the step, case by case, run in a subprocess by tests/test_tensor_contract.py.

Each case does what a user does with lazyxla tensors (save, load, pickle, copy, EMA, storages) and compares with the
same code on the CPU. A case that crashes the process fails its test (the parent names the case that was running).

    python -m tests.contract_cases DIR CASE [CASE ...]     # prints "START name" / "OK name" / "FAIL name: ..."
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import sys
import traceback
import zipfile
from pathlib import Path

import torch
from torch import nn

import lazyxla

dev = lazyxla.device()
DIR = "."
CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    assert torch.equal(a.cpu(), b.cpu()), (a, b)


def mixed_tensors() -> dict[str, torch.Tensor]:
    """CPU tensors of every dtype and shape class a checkpoint holds."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, 4, generator=g)
    out = {str(dt): (base * 10).to(dt) for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16)}
    for dt in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        out[str(dt)] = torch.randint(0, 100, (3, 4), generator=g).to(dt)
    out["bool"] = base > 0
    out["complex64"] = torch.complex(base, -base)
    out["0-d"] = torch.tensor(2.5)
    out["0-d int"] = torch.tensor(7)
    out["empty"] = torch.zeros(0, 3)
    out["slice"] = base[1:3]
    out["transposed"] = base.t()
    out["ids"] = torch.tensor([0, 5, 2**40], dtype=torch.int64)
    return out


def path(name: str) -> str:
    return os.path.join(DIR, name)


@case
def save_load_every_dtype():
    cpu = mixed_tensors()
    on = {k: v.to(dev) for k, v in cpu.items()}
    on["view of a device tensor"] = on["torch.float32"][1:, ::2]
    cpu["view of a device tensor"] = cpu["torch.float32"][1:, ::2]
    torch.save(on, path("mixed.pt"))
    for kwargs in ({}, {"weights_only": True}, {"weights_only": False}, {"mmap": True}):
        back = torch.load(path("mixed.pt"), **kwargs)
        for k, v in cpu.items():
            assert back[k].device == dev, (k, back[k].device)
            same(back[k], v)
    back = torch.load(path("mixed.pt"), map_location="cpu", weights_only=True)
    for k, v in cpu.items():
        assert back[k].device.type == "cpu"
        same(back[k], v)


@case
def load_cpu_checkpoint_with_map_location():
    cpu = mixed_tensors()
    torch.save(cpu, path("cpu.pt"))
    for where in (dev, "lazyxla", "lazyxla:0", {"cpu": "lazyxla:0"}, torch.device("lazyxla", 0)):
        back = torch.load(path("cpu.pt"), map_location=where, weights_only=True)
        for k, v in cpu.items():
            assert back[k].device == dev, (where, k, back[k].device)
            same(back[k], v)


@case
def legacy_format_and_buffers():
    cpu = mixed_tensors()
    buf = io.BytesIO()
    torch.save({k: v.to(dev) for k, v in cpu.items()}, buf)  # a file object: PyTorch's own save
    buf.seek(0)
    back = torch.load(buf, weights_only=True)
    for k, v in cpu.items():
        assert back[k].device == dev
        same(back[k], v)
    buf = io.BytesIO()
    torch.save({k: v.to(dev) for k, v in cpu.items()}, buf, _use_new_zipfile_serialization=False)
    buf.seek(0)
    back = torch.load(buf, map_location="cpu", weights_only=True)
    for k, v in cpu.items():
        same(back[k], v)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)  # the legacy format fills storages after building the tensors
    for k, v in cpu.items():
        assert back[k].device == dev
        same(back[k], v)


@case
def pickle_tensors_and_parameters():
    t = torch.arange(6.0).reshape(2, 3)
    p = nn.Parameter(t.to(dev))
    for obj, ref in ((t.to(dev), t), (t.to(dev).requires_grad_(), t)):
        back = pickle.loads(pickle.dumps(obj))
        assert back.device == dev and back.requires_grad == obj.requires_grad
        same(back, ref)
    back = pickle.loads(pickle.dumps(p))
    assert type(back) is nn.Parameter and back.requires_grad and back.device == dev
    same(back.detach(), t)
    c = copy.copy(t.to(dev))
    assert c.device == dev
    same(c, t)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight
        self.norm = nn.BatchNorm1d(4)

    def forward(self, ids):
        return self.head(self.norm(self.emb(ids)))


def train(model, opt, steps: int, device) -> list[float]:
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, 10, (8,), generator=g).to(device)
        loss = nn.functional.cross_entropy(model(ids), ids)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@case
def ties_survive_save_and_deepcopy():
    torch.manual_seed(0)
    model = Tied().to(dev)
    torch.save(model, path("model.pt"))
    back = torch.load(path("model.pt"), weights_only=False)
    assert back.head.weight is back.emb.weight and back.emb.weight.device == dev
    same(back.emb.weight.detach(), model.emb.weight.detach())
    torch.save(model.state_dict(), path("sd.pt"))
    with zipfile.ZipFile(path("sd.pt")) as z:  # the tied weight's two entries are written once
        records = [n for n in z.namelist() if "/data/" in n]
    assert len(records) == len(model.state_dict()) - 1, records
    fresh = Tied().to(dev)
    fresh.load_state_dict(torch.load(path("sd.pt"), weights_only=True))
    assert fresh.head.weight is fresh.emb.weight
    same(fresh.head.weight.detach(), model.head.weight.detach())
    twin = copy.deepcopy(model)
    assert twin.head.weight is twin.emb.weight and twin.emb.weight is not model.emb.weight
    sd = copy.deepcopy(model.state_dict())
    sd["emb.weight"].add_(1)  # the two entries of a tied weight stay one storage in the copy, as on CUDA
    same(sd["head.weight"], sd["emb.weight"])
    same(model.emb.weight.detach(), twin.emb.weight.detach())  # the original did not move


@case
def deepcopy_tensors_modules_optimizers():
    t = torch.arange(5.0).to(dev).requires_grad_()
    t.grad = torch.ones(5).to(dev)
    c = copy.deepcopy(t)
    assert c is not t and c.requires_grad and c.is_leaf and c.grad is not None
    same(c.detach(), torch.arange(5.0))
    same(c.grad, torch.ones(5))
    with torch.no_grad():
        c.mul_(2)
    same(t.detach(), torch.arange(5.0))  # independent
    for empty in (torch.zeros(0).to(dev), torch.tensor(3).to(dev), torch.ones(2, dtype=torch.bool).to(dev)):
        same(copy.deepcopy(empty), empty)
    torch.manual_seed(0)
    cpu_model, model = Tied(), None
    model = copy.deepcopy(cpu_model).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=0.1)
    train(model, opt, 2, dev)
    train(cpu_model, cpu_opt, 2, "cpu")
    snapshot = copy.deepcopy(model)
    state = copy.deepcopy(opt.state_dict())
    train(model, opt, 1, dev)  # the copies do not move with the original
    for (name, p), q in zip(snapshot.state_dict().items(), cpu_model.state_dict().values()):
        assert p.device == dev, name
        assert torch.allclose(p.cpu().float(), q.float(), rtol=1e-4, atol=1e-5), name
    for k, v in state["state"].items():
        ref = cpu_opt.state_dict()["state"][k]
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(v[name].cpu(), ref[name], rtol=1e-4, atol=1e-6), (k, name)


@case
def resume_optimizer_from_checkpoint():
    torch.manual_seed(0)
    cpu_model = Tied()
    model = copy.deepcopy(cpu_model).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=0.05)
    train(model, opt, 2, dev)
    train(cpu_model, cpu_opt, 2, "cpu")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path("resume.pt"))
    ckpt = torch.load(path("resume.pt"), map_location=dev, weights_only=True)
    again = Tied().to(dev)
    again.load_state_dict(ckpt["model"])
    again_opt = torch.optim.AdamW(again.parameters(), lr=0.05)
    again_opt.load_state_dict(ckpt["opt"])
    ours = train(again, again_opt, 2, dev)
    ref = train(cpu_model, cpu_opt, 2, "cpu")
    assert all(abs(a - b) < 1e-4 for a, b in zip(ours, ref)), (ours, ref)


@case
def deepcopy_keeps_views_of_the_copied_base():
    """``deepcopy`` of a base with its views and storages, in any order, gives views and storages of the copied base
    (PyTorch copies a storage once per call), compared with the same code on the CPU: the views were separate
    copies, and a write to the copied base did not reach them (PyTorch's test_torch: test_deepcopy)."""
    import warnings

    warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated: PyTorch's own test reads it
    got = {}
    for device in ("cpu", dev):
        a = torch.arange(25.0).reshape(5, 5).to(device)
        b = (torch.arange(25.0).reshape(5, 5) * 2).to(device)
        q = [a, [a.storage(), b.storage()], b, a.view(25), a[1:].t(), a.detach()]
        w = copy.deepcopy(q)
        w[0].add_(1)
        w[2].sub_(1)
        got[torch.device(device).type] = [torch.tensor(w[1][0].tolist()), torch.tensor(w[1][1].tolist()), *w[2:], w[0]]
        view, base, storage = copy.deepcopy([a[2:], a, a.untyped_storage()])  # the view before its base
        base.mul_(2)
        view.add_(1)
        got[torch.device(device).type] += [view, base, torch.tensor(storage, dtype=torch.float32)]
        assert torch.equal(a.cpu(), torch.arange(25.0).reshape(5, 5))  # the originals are untouched
        lone = copy.deepcopy(a[1:3])  # a view alone: its copy keeps the whole storage, at the view's offset
        got[torch.device(device).type] += [
            torch.tensor(lone.untyped_storage().nbytes()),
            torch.tensor(lone.data_ptr() - lone.untyped_storage().data_ptr()),
        ]
    for c, d in zip(got["cpu"], got[dev.type]):
        same(d.cpu(), c)


@case
def ema_averaged_model():
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    model = copy.deepcopy(cpu_model).to(dev)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    cpu_ema = AveragedModel(cpu_model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    for m, e, opt, d in (
        (model, ema, torch.optim.SGD(model.parameters(), lr=0.1), dev),
        (cpu_model, cpu_ema, torch.optim.SGD(cpu_model.parameters(), lr=0.1), "cpu"),
    ):
        g = torch.Generator().manual_seed(2)
        for _ in range(3):
            x = torch.randn(6, 4, generator=g).to(d)
            m(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            e.update_parameters(m)
    for (name, p), q in zip(ema.state_dict().items(), cpu_ema.state_dict().values()):
        assert p.device == (torch.device("cpu") if name == "n_averaged" else dev), name  # n_averaged: CPU, as CUDA
        assert torch.allclose(p.cpu().float(), q.float(), rtol=1e-4, atol=1e-5), (name, p, q)


@case
def failed_save_keeps_previous_checkpoint():
    good = {"w": torch.arange(4.0).to(dev)}
    torch.save(good, path("keep.pt"))
    before = Path(path("keep.pt")).read_bytes()
    try:
        torch.save({"w": torch.ones(3).to(dev), "bad": lambda: 0}, path("keep.pt"))
    except Exception:
        pass
    else:
        raise AssertionError("saving a lambda should fail")
    assert Path(path("keep.pt")).read_bytes() == before
    same(torch.load(path("keep.pt"))["w"], torch.arange(4.0))
    assert [n for n in os.listdir(DIR) if "keep.pt" in n] == ["keep.pt"], os.listdir(DIR)
    try:
        torch.save(good, path("missing/folder/x.pt"))
    except RuntimeError as e:  # PyTorch's own error for a missing folder
        assert "missing" in str(e) or "does not exist" in str(e), e
    else:
        raise AssertionError("a missing folder should fail")


@case
def storages():
    t = torch.arange(6.0).to(dev)
    s = t.untyped_storage()
    assert s.device == dev and s.nbytes() == 24
    assert t._typed_storage().size() == 6
    # an address that identifies the storage (as a CUDA storage's device address does): views share it
    assert (
        s.data_ptr() != 0
        and s.data_ptr() == t[2:].untyped_storage().data_ptr() == t.detach().untyped_storage().data_ptr()
    )
    assert s.data_ptr() != t.clone().untyped_storage().data_ptr()
    # a tensor's address is its storage's plus its offset there on the CPU, as a CUDA tensor's: copies differ
    c, m = torch.arange(25.0).view(5, 5), torch.arange(25.0).view(5, 5).to(dev)
    for view in (lambda x: x, lambda x: x[1], lambda x: x[:, 2], lambda x: x[2:].t(), lambda x: x.reshape(25)):
        assert view(m).data_ptr() - m.data_ptr() == view(c).data_ptr() - c.data_ptr()
    for copied in (lambda x: x.t().contiguous(), lambda x: x.t().reshape(25), lambda x: x.clone()):
        assert copied(m).data_ptr() != m.data_ptr() and copied(m).untyped_storage().data_ptr() != s.data_ptr()
    assert torch.empty(0, device=dev).data_ptr() == 0 == torch.empty(0).data_ptr()
    # legacy typed storage classes in torch.lazyxla, as torch.cuda has its own
    for dtype in (torch.float32, torch.int64, torch.bool, torch.bfloat16):
        kind = torch.ones(2, dtype=dtype, device=dev).storage_type()
        assert kind is getattr(getattr(torch, dev.type), torch.ones(2, dtype=dtype).storage_type().__name__), kind
        assert isinstance(torch.ones(2, dtype=dtype, device=dev).storage(), kind)
        assert not isinstance(torch.ones(2, dtype=dtype).storage(), kind)
    assert getattr(torch, dev.type).FloatStorage(3).device.type == dev.type
    made = torch.UntypedStorage(8, device=dev)
    assert made.device == dev and made.nbytes() == 8
    moved = torch.ones(3).untyped_storage().to(device=dev)
    back = torch.empty(0, device=dev).set_(moved, 0, (3,), (1,))
    same(back, torch.ones(3))
    typed = torch.arange(4.0).storage().to(device=dev)  # TypedStorage.to
    assert typed.device == dev
    assert moved.cpu().device.type == "cpu"
    same(torch.empty(0, device=dev).set_(torch.arange(3).untyped_storage()).view(torch.int64), torch.arange(3))
    # reads go through the tensor holding the storage's values (a host read), as on CUDA through device memory
    v = torch.arange(15.0).view(3, 5)
    d = v.to(dev)
    assert d.storage()[14] == 14.0 and d.storage().tolist() == v.storage().tolist()
    assert d.untyped_storage().tolist() == v.untyped_storage().tolist()
    assert d[1:].untyped_storage().cpu().tolist() == v.untyped_storage().tolist()  # a view's storage is its base's
    assert bytes(d.untyped_storage().clone().cpu().tolist()) == bytes(v.untyped_storage().tolist())
    same(
        torch.empty(0, device=dev).set_(d.storage(), 2, (2, 2), (5, 1)),
        torch.empty(0).set_(v.storage(), 2, (2, 2), (5, 1)),
    )
    same(torch.zeros(2, device=dev).set_(d.storage(), 0, (), ()), torch.tensor(0.0))
    same(torch.tensor([], device=dev).set_(d.storage()), torch.arange(15.0))
    back = pickle.loads(pickle.dumps(d.storage()))
    assert back.device == dev and back.tolist() == v.storage().tolist()
    for bad in (  # writes through a storage cannot reach the device: a clear error
        lambda: s.__setitem__(0, 1),
        lambda: s.fill_(0),
        lambda: s.copy_(torch.ones(6).untyped_storage()),
        lambda: s.resize_(100),
        lambda: torch.empty(0, device=dev).set_(torch.arange(6.0).to(dev)[2:].untyped_storage()),  # nobody asked
        lambda: torch.empty(0, device=dev, dtype=torch.int32).set_(d.untyped_storage()),
        lambda: torch.empty(0, device=dev).set_(d.storage(), 10, (3, 3), (3, 1)),
    ):
        try:
            bad()
        except RuntimeError:
            pass
        else:
            raise AssertionError("should raise")


@case
def tensor_from_storage_and_linked_deepcopy():
    """``torch.tensor(storage)`` (PyTorch's C++ sets a bare device tensor to the storage, below the Python key) and a
    deep copy of a tensor with its storage, each compared with the same code on the CPU."""
    for dt in (torch.float32, torch.int64, torch.bfloat16, torch.bool):
        c = (torch.arange(24.0).reshape(2, 3, 4) - 7).to(dt)
        d = c.to(dev)
        for storage in (lambda x: x.storage(), lambda x: x.untyped_storage()):
            for kw in ({}, {"device": dev}):
                got = torch.tensor(storage(d), dtype=dt, **kw)
                assert got.device == (dev if kw else torch.device("cpu")), got.device
                same(got.reshape(2, 3, 4), torch.tensor(storage(c), dtype=dt).reshape(2, 3, 4))
        other = torch.float16 if dt != torch.float16 else torch.float32
        for t in (c, d):
            try:
                torch.tensor(t.storage(), dtype=other)
            except RuntimeError as e:
                assert "Expected a Storage of type" in str(e), e
            else:
                raise AssertionError("should raise")
        # the storage of a temporary: it keeps the values (and PyTorch's dtype check) as on the CPU
        for t in (c, d):
            storage = t.clone().storage()
            same(torch.tensor(storage, dtype=dt), torch.tensor(c.storage(), dtype=dt))
            try:
                torch.tensor(t.clone().storage(), dtype=other)
            except RuntimeError as e:
                assert "Expected a Storage of type" in str(e), e
            else:
                raise AssertionError("should raise")
    c = torch.arange(6.0)
    d = c.to(dev)
    copies = {}
    for x in (c, d):  # the copied storage reads the copied tensor's values, as on the CPU
        t, s = copy.deepcopy([x, x.untyped_storage()])
        t.add_(1)
        copies[x.device.type] = (t, s)
        assert torch.tensor(s, dtype=torch.float32).tolist() == t.tolist()
        assert x.tolist() == list(range(6))  # the original is untouched
    same(copies[dev.type][0], copies["cpu"][0])


@case
def no_crash_on_pointers():
    import numpy as np

    t = torch.arange(6.0).to(dev)
    # an address that identifies the storage, offset as on the CPU (a CUDA tensor's is a device address)
    assert t.data_ptr() == t.untyped_storage().data_ptr() != 0
    assert t[2:].data_ptr() == t.data_ptr() + 8 and t.clone().data_ptr() != t.data_ptr()
    for bad, errors in (
        (lambda: t.numpy(), TypeError),
        (lambda: np.asarray(t), TypeError),
        (lambda: torch.utils.dlpack.to_dlpack(t), BufferError),
        (lambda: t.__dlpack__(), BufferError),
        (lambda: np.from_dlpack(t), BufferError),
        (lambda: torch.from_dlpack(t), (BufferError, ValueError)),
    ):
        try:
            bad()
        except errors:
            pass
        else:
            raise AssertionError("should raise")
    r = torch.ones(3).to(dev)
    r.resize_(2)
    same(r, torch.ones(2))
    same(torch.zeros(2).to(dev).set_(t), torch.arange(6.0))


@case
def hugging_face_save_pretrained():
    import safetensors.torch
    import transformers

    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=32)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).to(dev)
    model.save_pretrained(path("gpt2"))  # groups tied weights by storage address, writes safetensors
    back = transformers.GPT2LMHeadModel.from_pretrained(path("gpt2")).to(dev)
    assert back.lm_head.weight is back.transformer.wte.weight
    for p, q in zip(model.state_dict().values(), back.state_dict().values()):
        same(p, q)
    safetensors.torch.save_file({"a": torch.arange(3.0).to(dev)}, path("x.safetensors"))
    same(safetensors.torch.load_file(path("x.safetensors"))["a"], torch.arange(3.0))


def main(argv: list[str]) -> int:
    global DIR
    DIR = argv[0]
    failed = 0
    for name in argv[1:]:
        print("START", name, flush=True)
        try:
            CASES[name]()
        except Exception:
            failed += 1
            print("FAIL", name + ":", traceback.format_exc().replace("\n", "\n    "), flush=True)
        else:
            print("OK", name, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
