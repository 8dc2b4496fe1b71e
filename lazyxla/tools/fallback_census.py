"""The fallback census: which ops of real models would run on the CPU, and whether their numbers are right.

Each model of the zoo (``lazyxla.tools.census_zoo``: transformers vision, audio and seq2seq families, diffusers
UNets and VAEs, timm where it imports; tiny random configs, nothing downloaded) runs one forward and backward on
the lazyxla device, with fallbacks allowed but counted (``fallback.<op>`` in ``lazyxla.metrics``), and the same
step on CPU eager. The row of a model lists the ops that fell back (the project's goal: none), how far its loss is
from CPU eager's, and whether every parameter gradient agrees by the rule of tests/clients/agreement.py (``rtol``
1e-4; ``atol`` 1e-5 in the unit of the tensor's largest gradient plus 10 times the CPU's own float32 rounding
error, measured against float64 from the same weights).

Usage::

    python -m lazyxla.tools.fallback_census                       # the whole zoo, a table on stdout
    python -m lazyxla.tools.fallback_census resnet swin           # models whose name contains a word
    python -m lazyxla.tools.fallback_census --markdown docs/ops.md   # also write the table into the doc's section

Example (in a test)::

    row = census("hf_resnet")
    assert not row.fallbacks and row.agrees, row.line()
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import re
import sys
from pathlib import Path

import torch

import lazyxla
from lazyxla.tools import census_zoo, torch_xla_api

RTOL, ATOL, NOISE = 1e-4, 1e-5, 10  # the rule of tests/clients/agreement.py
BEGIN, END = "<!-- fallback-census:begin -->", "<!-- fallback-census:end -->"


@dataclasses.dataclass
class Row:
    """One model's census: the ops that fell back (op -> calls), the losses, and the worst gradient."""

    name: str
    fallbacks: dict[str, int] = dataclasses.field(default_factory=dict)
    loss: float = float("nan")
    loss_cpu: float = float("nan")
    loss_ok: bool = False
    grads_ok: bool = False
    worst: str = ""  # the gradient furthest past its tolerance, or the error that stopped the run
    error: str = ""

    @property
    def agrees(self) -> bool:
        return not self.error and self.loss_ok and self.grads_ok

    def line(self) -> str:
        fell = ", ".join(f"{op} ×{n}" for op, n in sorted(self.fallbacks.items())) or "none"
        if self.error:
            return f"{self.name}: ERROR {self.error}"
        agree = "yes" if self.agrees else f"NO ({self.worst})"
        return f"{self.name}: fallbacks {fell}; loss {self.loss:.6g} vs CPU {self.loss_cpu:.6g}; agrees {agree}"


def _to(batch: dict, device, dtype=None) -> dict:
    def move(v):
        if not isinstance(v, torch.Tensor):
            return v
        v = v.to(device)
        return v.to(dtype) if dtype is not None and v.is_floating_point() else v

    return {k: move(v) for k, v in batch.items()}


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}


def _step(model, batch, loss_of, device, dtype=None):
    """One forward and backward of ``model`` on ``device``: the loss (a CPU scalar) and the gradients."""
    model = model.to(device) if dtype is None else model.to(device, dtype)
    loss = loss_of(model, **_to(batch, device, dtype))
    loss.backward()
    if device.type != "cpu":
        lazyxla.sync()
    return loss.detach().cpu().double(), _grads(model)


def _worst_gradient(got: dict, want: dict, exact: dict | None) -> tuple[bool, str]:
    """Every gradient within the rule; else the name of the tensor furthest past it and by how much."""
    if got.keys() != want.keys():
        return False, f"gradients of different parameters: {sorted(got.keys() ^ want.keys())[:3]}"
    worst, excess_max = "", 0.0
    # A gradient that is zero on the CPU, in float64 too (a batch norm's bias feeding another batch norm), is
    # rounding noise wherever the order of the sums differs: it may be a float32 step of the model's gradients.
    zero_floor = torch.finfo(torch.float32).eps * max(w.abs().max().item() for w in want.values())
    for name, w in want.items():
        noise = (w.double() - exact[name]).abs().max().item() if exact is not None else 0.0
        unit = w.abs().max().item()
        # (and XLA flushes float32 subnormals to zero: below the smallest normal number, zero is as right)
        atol = ATOL * unit + NOISE * noise + (zero_floor if unit == 0 else 0.0) + torch.finfo(torch.float32).tiny
        excess = ((got[name] - w).abs() - (RTOL * w.abs() + atol)).max().item()
        if excess > excess_max:
            worst, excess_max = f"{name}.grad off by {excess:.2g} past tolerance", excess
    return not worst, worst


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0][:200] if str(e).strip() else ""


def census(name: str, device: torch.device | None = None) -> Row:
    """Run model ``name`` of the zoo once forward and backward on lazyxla and on CPU eager; compare.

    Example::

        census("diffusers_vae").fallbacks      # {} when every op has a rule
    """
    device = device or lazyxla.device()
    row = Row(name)
    try:  # CPU eager first: an entry that does not run there is the zoo's error, not lazyxla's
        model, batch, loss_of = census_zoo.build(name)
        lazy = copy.deepcopy(model)
        cpu_loss, cpu_grads = _step(copy.deepcopy(model), batch, loss_of, torch.device("cpu"))
    except census_zoo.Unavailable as e:
        row.error = str(e)
        return row
    except Exception as e:  # noqa: BLE001  (a zoo entry that does not run on the CPU is its row's error)
        row.error = f"the zoo's entry fails on the CPU: {type(e).__name__}: {_first_line(e)}"
        return row
    try:
        exact_loss, exact_grads = _step(model, batch, loss_of, torch.device("cpu"), torch.float64)
    except (RuntimeError, TypeError):  # a model that keeps a float32 part: the rule without the noise term
        exact_loss, exact_grads = cpu_loss, None
    lazyxla.sync()
    lazyxla.metrics.reset()
    try:
        with lazyxla.config.override(strict=False, warn_fallback=False):
            loss, grads = _step(lazy, batch, loss_of, device)
    except Exception as e:  # noqa: BLE001  (a census reports every model; the error is the row)
        row.error = f"{type(e).__name__}: {_first_line(e)}"
        return row
    finally:
        row.fallbacks = {
            k.removeprefix("fallback."): v for k, v in lazyxla.metrics.counters().items() if k.startswith("fallback.")
        }
    row.loss, row.loss_cpu = loss.item(), cpu_loss.item()
    noise = abs(row.loss_cpu - exact_loss.item())
    row.loss_ok = abs(row.loss - row.loss_cpu) <= ATOL + RTOL * abs(row.loss_cpu) + NOISE * noise
    row.grads_ok, row.worst = _worst_gradient(grads, cpu_grads, exact_grads)
    if not row.loss_ok:
        row.worst = f"loss off by {abs(row.loss - row.loss_cpu):.2g}; " + row.worst
    return row


def markdown(rows: list[Row]) -> str:
    """The census as a Markdown table."""
    lines = [
        "| model | source | ops that fall back | loss (lazyxla / CPU) | gradients agree |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        fell = ", ".join(f"`{op}` ×{n}" for op, n in sorted(r.fallbacks.items())) or "none"
        source = census_zoo.ZOO[r.name].source
        if r.error:
            lines.append(f"| {r.name} | {source} | {fell} | not run: {r.error} | |")
            continue
        agree = "yes" if r.agrees else f"**no**: {r.worst}"
        lines.append(f"| {r.name} | {source} | {fell} | {r.loss:.6g} / {r.loss_cpu:.6g} | {agree} |")
    return "\n".join(lines) + "\n"


def write_section(path: Path, table: str) -> None:
    """Replace the text between the census markers of ``path`` with ``table`` (atomically)."""
    torch_xla_api.write_section(path, BEGIN, END, table.rstrip("\n"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("words", nargs="*", help="run only the models whose name contains one of these")
    parser.add_argument("--markdown", type=Path, help="write the table between the census markers of this file")
    args = parser.parse_args(argv)
    names = [n for n in census_zoo.ZOO if not args.words or any(re.search(w, n) for w in args.words)]
    rows = []
    for name in names:
        rows.append(census(name))
        print(rows[-1].line(), flush=True)
    fell = sorted({op for r in rows for op in r.fallbacks})
    print(f"\n{len(rows)} models; ops that fall back: {', '.join(fell) or 'none'}")
    if args.markdown:
        write_section(args.markdown, markdown(rows))
    return 0 if not fell and all(r.agrees or r.error.startswith("unavailable") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
