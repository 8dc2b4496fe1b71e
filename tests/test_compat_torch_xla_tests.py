"""Behaviours of torch_xla's public API that its own tests rely on (issue 17 point 6): the errors ``xs.Mesh`` raises,
and what ``import torch_xla`` sets up for ``torch.distributed``.
"""

from __future__ import annotations

import numpy as np
import pytest

import lazyxla.compat as compat
from tests.util import run_torch_xla_script


@pytest.fixture
def xs():
    assert compat.install()
    import torch_xla.distributed.spmd as xs

    yield xs
    compat.uninstall()


@pytest.mark.parametrize(
    "ids,shape,names,message",
    [
        # torch_xla's test_fsdp_v2_multi_slice_error on 1 device: a (2, 0, 1) mesh holds no device
        ([0], (2, 0, 1), ("data", "fsdp", "tensor"), r"Number of device IDs \(1\) must match mesh size \(0\)"),
        (np.arange(4), (2, 2), ("a",), r"Number of axis names \(1\) must match mesh dimensions \(2\)"),
        (np.arange(4), (2, 2), ("a", "a"), r"Axis names must be unique, got: \('a', 'a'\)"),
        ([0, 0, 1, 2], (2, 2), None, r"Device IDs must be unique"),
        ([0, 1, 2, 7], (2, 2), None, r"Device IDs must be less than mesh size \(4\)"),
    ],
)
def test_mesh_checks_raise_assertion_errors_as_torch_xla(xs, ids, shape, names, message):
    with pytest.raises(AssertionError, match=message):
        xs.Mesh(ids, shape, names)


IMPORT_ONLY = r"""
import json
import torch.distributed as dist
import torch_xla
from lazyxla.torch_private import has_rendezvous_handler

out = {"backend": "xla" in dist.Backend.backend_list, "xla_url": has_rendezvous_handler("xla")}
print("RESULT " + json.dumps(out))
"""


def test_import_torch_xla_registers_the_xla_backend_and_its_init_method(tmp_path):
    # torch_xla's own import reaches torch_xla.distributed.xla_backend (through its spawn machinery): scripts call
    # dist.init_process_group("xla", init_method="xla://") without importing it (test_torch_distributed_fsdp_meta.py)
    out = run_torch_xla_script(IMPORT_ONLY, tmp_path, timeout=120)
    assert out == {"backend": True, "xla_url": True}
