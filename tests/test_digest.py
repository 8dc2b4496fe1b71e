"""``ir.digest``: the one name of a recorded graph (disk cache entries, torch.compile traces, the SPMD check)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

import lazyxla
from lazyxla.ir import digest
from lazyxla.lazy.graph import plan
from lazyxla.lazy.tensor import unwrap

ROOT = Path(__file__).resolve().parents[1]

# Records a program and variants of it that differ in one thing each; prints each one's digest (the full
# walk and the O(roots) form) as JSON. Nothing is synced: the digests are of the recorded graphs.
_PROGRAMS = r"""
import json, torch, lazyxla
from lazyxla.lazy.graph import plan
from lazyxla.ir import digest
from lazyxla.lazy.tensor import unwrap

def names(t):
    roots, order, leaves, _ = plan([unwrap(t)])
    return [digest(order, leaves, roots, extra=("device 0",)), digest(None, leaves, roots, size=8)]

def program(shape=(4, 3), dtype=torch.float32, dim=0, shared=True):
    x = torch.ones(shape, dtype=dtype).to("lazyxla")
    if shared:
        a = torch.cumsum(x, dim)
        return a * a                                   # one cumsum, read twice
    return torch.cumsum(x, dim) * torch.cumsum(x, dim)  # two equal cumsums

print(json.dumps({
    "same": names(program()),
    "attribute": names(program(dim=1)),
    "shape": names(program(shape=(5, 3))),
    "dtype": names(program(dtype=torch.float64)),
    "sharing": names(program(shared=False)),
}))
"""


def _digests(seed: str) -> dict:
    env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT), LAZYXLA_PERSISTENT_CACHE="0")
    proc = subprocess.run([sys.executable, "-c", _PROGRAMS], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_digest_is_the_same_in_fresh_processes_and_tells_programs_apart():
    first, second = _digests("1"), _digests("2")  # Python's hash() of strings differs between the two
    assert first == second
    full = {name: d[0] for name, d in first.items()}
    assert len(set(full.values())) == len(full), full  # an attribute, a shape, a dtype or the sharing changed
    # the O(roots) form names nodes by their structural hashes: it tells apart all but the sharing
    by_hash = {name: d[1] for name, d in first.items()}
    assert by_hash["sharing"] == by_hash["same"]
    assert len({v for k, v in by_hash.items() if k != "sharing"}) == len(by_hash) - 1, by_hash


def _graph(scale: float):
    x = torch.ones(3).to("lazyxla")
    roots, order, leaves, _ = plan([unwrap(x * scale)])
    return order, leaves, roots


def test_scalars_are_inputs_unless_baked_in(dev):
    """Lazy mode passes a Python float as an argument (a new learning rate is the same program); a
    torch.compile trace bakes it in, so there the value is part of the name."""
    half, quarter = _graph(0.5), _graph(0.25)
    assert digest(*half) == digest(*quarter)
    assert digest(*half, baked_scalars=True) != digest(*quarter, baked_scalars=True)
    lazyxla.sync()


def test_extra_fields_and_numbered_inputs_are_part_of_the_name(dev):
    order, leaves, roots = _graph(0.5)
    assert digest(order, leaves, roots, extra=(0,)) != digest(order, leaves, roots, extra=(1,))
    data = next(n for n in leaves if n.op.value == "data")
    assert digest(order, leaves, roots, inputs={id(data): 0}) != digest(order, leaves, roots, inputs={id(data): 1})
    assert digest(order, leaves, roots, inputs={id(data): 0}) != digest(order, leaves, roots)
    lazyxla.sync()
