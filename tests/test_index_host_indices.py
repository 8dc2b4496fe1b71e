"""Index tensors as PyTorch takes them, against CPU eager: CPU index tensors and masks index a lazyxla tensor
(PyTorch moves them to ``self``'s device, so CUDA takes them), and uint8 masks work as bool ones, with
PyTorch's deprecation warning at each user line (PyTorch's test_indexing: test_byte_mask, test_index_put_src)."""

from __future__ import annotations

import warnings

import pytest
import torch

import lazyxla


def _x():
    torch.manual_seed(0)
    return torch.randn(5, 4)


def _both(fn, *host):
    """``fn(x, *host)`` for x on the CPU and on lazyxla (the index tensors ``host`` stay on the CPU)."""
    x = _x()
    return fn(x.clone(), *host), fn(x.to(lazyxla.device()), *host).cpu()


def _setitem(x, key, v):
    x[key] = v
    return x


CASES = {
    "long": (lambda x, i: x[i], torch.tensor([4, 0, 2, 2])),
    "long 2-d": (lambda x, i: x[i], torch.tensor([[1, 3], [0, 0]])),
    "two long": (lambda x, i, j: x[i, j], torch.tensor([0, 4]), torch.tensor([3, 1])),
    "slice and long": (lambda x, i: x[1:, i], torch.tensor([3, 0])),
    "bool mask": (lambda x, m: x[m], torch.tensor([True, False, True, True, False])),
    "bool mask 2-d": (lambda x, m: x[m], torch.arange(20).reshape(5, 4) % 3 == 0),
    "setitem long": (lambda x, i: _setitem(x, i, 7.0), torch.tensor([1, 3])),
    "setitem mask": (lambda x, m: _setitem(x, m, 0.0), torch.arange(20).reshape(5, 4) > 9),
    "index_put accumulate": (
        lambda x, i: x.index_put_((i,), torch.ones(4, device=x.device), accumulate=True),
        torch.tensor([2, 2, 0]),
    ),
    "index_put two": (
        lambda x, i, j: x.index_put_((i, j), torch.tensor(3.0, device=x.device)),
        torch.tensor([0, 4]),
        torch.tensor([3, 1]),
    ),
}


# a boolean-mask read has a shape that depends on the data: it runs on the CPU, as for a device mask
@pytest.mark.allow_fallback("aten.index.Tensor")
@pytest.mark.parametrize("name", CASES)
def test_cpu_index_tensors(name):
    fn, *host = CASES[name]
    want, got = _both(fn, *host)
    torch.testing.assert_close(got, want)


@pytest.mark.allow_fallback("aten.index.Tensor")  # the mask read, as above
@pytest.mark.parametrize("where", ["lazyxla", "cpu"])
def test_uint8_masks_are_masks_with_the_warning(where):
    mask = torch.tensor([1, 0, 1, 1, 0], dtype=torch.uint8)
    x = _x()
    d = x.to(lazyxla.device())
    m = mask.to(lazyxla.device()) if where == "lazyxla" else mask
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("default")
        got = d[m]
        got2 = d[m]  # a second line: a second warning, as on CPU
    torch.testing.assert_close(got.cpu(), x[mask.bool()])
    torch.testing.assert_close(got2.cpu(), x[mask.bool()])
    deprecations = [e for e in w if "torch.uint8 is now deprecated" in str(e.message)]
    assert len(deprecations) == 2 and all(e.filename == __file__ for e in deprecations), [str(e) for e in w]
    d[m] = 0.0
    x[mask.bool()] = 0.0
    torch.testing.assert_close(d.cpu(), x)


def test_values_on_the_cpu_still_raise():
    # only the indices move, as in PyTorch: a non-0-dim CPU value tensor for a device tensor is a mistake
    d = _x().to(lazyxla.device())
    with pytest.raises(RuntimeError, match="same device"):
        d.index_put_((torch.tensor([0, 1]).to(lazyxla.device()),), torch.ones(2, 4))
