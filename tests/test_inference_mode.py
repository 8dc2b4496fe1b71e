"""``torch.inference_mode()`` on lazyxla works for every op and view as on CPU eager (issue 26, point 5).

Each case runs in its own process (``run_case``): the failure this guards against was raised from PyTorch's C++
(``Cannot set version_counter for inference tensor``), and a crash there must fail the test, not the run. Every
case compares values and ``torch.is_inference`` with the same code on CPU eager.

The one difference from CPU, by design (lazy/tensor.py says why): a view of an inference tensor is a normal
tensor on lazyxla; ``_views_of_inference_tensors_are_normal`` pins it.
"""

from __future__ import annotations

import torch

import lazyxla
from tests.util import run_case


def _on_both(make, fn):
    """``fn(make(device))`` under inference mode on CPU and on lazyxla: (is_inference, value on the CPU) each."""
    results = []
    for device in ("cpu", lazyxla.device()):
        x = make(device)
        with torch.inference_mode():
            y = fn(x)
        results.append((torch.is_inference(y), y.cpu().clone()))
    return results


def _assert_like_cpu(name, make, fn):
    (cpu_inference, cpu_value), (inference, value) = _on_both(make, fn)
    assert inference == cpu_inference, f"{name}: is_inference {inference}, CPU {cpu_inference}"
    torch.testing.assert_close(value, cpu_value, rtol=0, atol=0, msg=name)


def _made_outside(device):
    return torch.arange(24.0).to(device)


def _views_of_tensors_made_outside():
    cases = {
        "slice": lambda a: a[2:5],
        "view": lambda a: a.view(4, 6),
        "t": lambda a: a.view(4, 6).t(),
        "view then slice": lambda a: a.view(4, 6)[:, :3],
        "select": lambda a: a.view(4, 6)[1],
        "expand": lambda a: a.view(4, 6)[:1].expand(3, 6),
        "unsqueeze squeeze": lambda a: a.unsqueeze(0).squeeze(0),
        "diagonal": lambda a: a.view(4, 6).diagonal(),
        "as_strided": lambda a: a.as_strided((2, 2), (1, 3)),
        "unbind": lambda a: a.view(4, 6).unbind(0)[2],
        "split": lambda a: a.split(5)[1],
        "chunk": lambda a: a.chunk(3)[2],
        "permute": lambda a: a.view(2, 3, 4).permute(2, 0, 1),
        "detach": lambda a: a.detach(),
        "alias of a view then op": lambda a: a[3:9].view(2, 3) * 2,
    }
    for name, fn in cases.items():
        _assert_like_cpu(name, _made_outside, fn)


def _ops_on_tensors_made_outside():
    cases = {
        "add": lambda a: a + 1,
        "matmul": lambda a: a.view(4, 6) @ a.view(6, 4),
        "softmax": lambda a: a.view(4, 6).softmax(-1),
        "index": lambda a: a.view(4, 6)[[0, 2]],
        "clone of a view": lambda a: a[1:4].clone(),
        "cat of views": lambda a: torch.cat([a[:3], a[5:8]]),
    }
    for name, fn in cases.items():
        _assert_like_cpu(name, _made_outside, fn)


def _tensors_made_inside():
    def inside(a):
        b = a * 2  # an inference tensor on both
        v = b[1:4]
        v.add_(1)  # in-place on a view of an inference tensor: b sees it
        return b.view(4, 6)[1] + v.sum()

    _assert_like_cpu("views and in-place on inference tensors", _made_outside, inside)
    _assert_like_cpu("a factory inside", _made_outside, lambda a: torch.ones(3, device=a.device) + a[:3])
    _assert_like_cpu("an upload inside", _made_outside, lambda a: torch.arange(3.0).to(a.device) * 2)


def _in_place_on_normal_tensors():
    def add_then_view(a):
        a.add_(1)  # a normal tensor stays normal; its later views are normal too
        return a[3:7]

    def view_in_place(a):
        a[2:5].mul_(2)  # through a view: the base sees it
        return a

    def regenerated_view(a):
        v = a[2:8]
        a.add_(1)  # v is regenerated from its base at its next use
        return v[1:] + (v * 2)[1:]

    cases = {"add_ then view": add_then_view, "view mul_": view_in_place, "regenerated": regenerated_view}
    for name, fn in cases.items():
        _assert_like_cpu(name, _made_outside, fn)
    # after inference mode, the tensors that were changed inside it still train as normal tensors
    w = torch.ones(4, requires_grad=True, device=lazyxla.device())
    with torch.inference_mode():
        w[1:3]  # a view of a leaf inside inference mode
    (w[1:] * 3).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), torch.tensor([0.0, 3.0, 3.0, 3.0]))


def _views_of_inference_tensors_are_normal():
    """The documented difference: on CPU a view of an inference tensor is an inference tensor."""
    for device, expected in (("cpu", True), (lazyxla.device(), False)):
        with torch.inference_mode():
            b = torch.arange(6.0, device=device) * 2
            assert torch.is_inference(b)
            assert torch.is_inference(b[1:4]) is expected, device


def _bert_forward():
    import transformers  # only this case needs it (a second of import)

    from tests.clients.architectures import build

    model, batch = build("bert")
    model.eval()
    dev = lazyxla.device()
    ids = batch["input_ids"]
    with torch.inference_mode():
        expected = model(input_ids=ids).logits
        # BERT reads position_ids[:, :seq] and token_type_ids[:, :seq] of buffers made outside inference mode
        model.to(dev)
        out = model(input_ids=ids.to(dev)).logits
        assert torch.is_inference(out) == torch.is_inference(expected)
        got = out.cpu()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert isinstance(model, transformers.BertForMaskedLM)


def test_views_of_tensors_made_outside_inference_mode():
    run_case(__file__, "_views_of_tensors_made_outside")


def test_ops_on_tensors_made_outside_inference_mode():
    run_case(__file__, "_ops_on_tensors_made_outside")


def test_tensors_made_inside_inference_mode():
    run_case(__file__, "_tensors_made_inside")


def test_in_place_ops_on_normal_tensors_under_inference_mode():
    run_case(__file__, "_in_place_on_normal_tensors")


def test_a_view_of_an_inference_tensor_is_normal_on_lazyxla():
    run_case(__file__, "_views_of_inference_tensors_are_normal")


def test_bert_forward_under_inference_mode_matches_cpu():
    run_case(__file__, "_bert_forward")
