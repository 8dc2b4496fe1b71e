"""Program size: StableHLO lines of a warm training step, lazyxla against ``jax.value_and_grad``.

A longer program is longer to compile, so the line count is the first-step (cold) cost that does not depend
on the machine's load. lazyxla's program is the one its third step runs (the same as the second's: the first
step's program also creates the optimizer state); jax's is ``benchmarks.jax_models``' jitted step.

``breakdown`` attributes lazyxla's lines to the aten op whose rule produced them (each rule lowered inside a
``jax.named_scope`` named after its op; constants and the packed Python scalars are lines of no op).

Example::

    python -m benchmarks.program_size gpt            # both counts, the ratio and the 25 largest op families
    sizes = program_size.measure("gpt", spec.GPTSpec())   # {'lazyxla': 5321, 'jax.jit': 4000, 'ratio': 1.33}
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import re

import jax

import lazyxla  # noqa: F401  (first: before any CPU autograd runs, see docs/performance.md)
from benchmarks import jax_models, torch_models
from benchmarks import report as R
from benchmarks import spec as S
from lazyxla.ir import Leaf
from lazyxla.lazy import graph, rebase
from lazyxla.lazy.tensor import live_tensors
from lazyxla.lowering import cache, to_jax

NO_OP = "(no op: constants, packed scalars, return)"
_LOC_DEF = re.compile(r"^(#loc\d*) = loc\((.*)\)$")
_LOC_USE = re.compile(r"loc\((#loc\d*)\)\s*$")
_SCOPE = re.compile(r'"jit\([^"]*?\)/([^/"]+)')


def count_lines(text: str) -> int:
    """The StableHLO lines of a module's text (without debug locations): every non-blank line."""
    return sum(1 for line in text.splitlines() if line.strip())


def jax_text(model: str, spec: S.MLPSpec | S.GPTSpec) -> str:
    """The StableHLO of ``benchmarks.jax_models``' training step of ``model`` (``jax.value_and_grad`` + optimizer)."""

    return jax_models.make_step(model, spec).lowered().as_text()


def _warm_graph(model: str, spec: S.MLPSpec | S.GPTSpec):
    """lazyxla's recorded third training step (lazy mode, ``zero_grad`` after ``step``), not run: the graph
    ``(order, leaves, roots)`` the sync would compile, and the device."""

    record, sync = torch_models.setup(model, spec, "lazyxla")
    for _ in range(2):
        loss = record()
        sync()
        loss.item()
    loss = record()
    pending = [t for t in live_tensors() if t._value[0].op.__class__ is not Leaf]
    pending, _, _ = rebase.split(pending)  # as lazy.graph.sync does
    roots, order, leaves, _ = graph.plan(pending)
    out = order, leaves, roots, pending[0]._value[0].device
    del loss
    sync()
    return out


def lazyxla_text(model: str, spec: S.MLPSpec | S.GPTSpec, scoped: bool = False) -> str:
    """The StableHLO of lazyxla's warm training step of ``model``; ``scoped``: with debug locations, each rule's
    lines inside a name scope named after its aten op (for ``breakdown``)."""

    order, leaves, roots, device = _warm_graph(model, spec)
    with _op_scopes() if scoped else contextlib.nullcontext():
        lowered = cache.lower(order, leaves, roots, device)
    return lowered.as_text(debug_info=scoped)


@contextlib.contextmanager
def _op_scopes():
    """Each node's rule lowered inside ``jax.named_scope(<its aten op>)`` (locations only: the same ops)."""

    original = to_jax.apply

    def scoped(n, ins, axis=None, world=1):
        with jax.named_scope(str(n.op)):
            return original(n, ins, axis, world)

    to_jax.apply = scoped
    try:
        yield
    finally:
        to_jax.apply = original


def breakdown(scoped_text: str) -> dict[str, int]:
    """Lines per aten op of a program lowered with ``scoped=True``, largest first.

    Example::

        breakdown(lazyxla_text("gpt", spec, scoped=True))   # {'aten.mm.default': 412, ...}
    """
    defs = {}
    for line in scoped_text.splitlines():
        m = _LOC_DEF.match(line)
        if m:
            defs[m.group(1)] = m.group(2)
    counts: collections.Counter[str] = collections.Counter()
    for line in scoped_text.splitlines():
        if not line.strip() or _LOC_DEF.match(line):
            continue
        use = _LOC_USE.search(line)
        counts[_scope(defs, use.group(1)) if use else NO_OP] += 1
    return dict(counts.most_common())


def _scope(defs: dict[str, str], ref: str, depth: int = 0) -> str:
    """The aten op named by location ``ref`` (following location references), or ``NO_OP``."""
    body = defs.get(ref, "")
    m = _SCOPE.search(body)
    if m and m.group(1).startswith(("aten.", "lazyxla.")):
        return m.group(1)
    if depth < 8:
        for inner in re.findall(r"#loc\d*", body):
            found = _scope(defs, inner, depth + 1)
            if found != NO_OP:
                return found
    return NO_OP


def op_kinds(text: str) -> dict[str, int]:
    """Lines per StableHLO operation kind (``stablehlo.add``, ``stablehlo.broadcast_in_dim``, ...), largest first."""
    kinds = collections.Counter(m.group(1) for m in re.finditer(r"= (\w+\.\w+)", text))
    return dict(kinds.most_common())


def measure(model: str, spec: S.MLPSpec | S.GPTSpec) -> dict[str, float]:
    """StableHLO lines of the warm training step: lazyxla's, jax.value_and_grad's and their ratio."""
    lazy = count_lines(lazyxla_text(model, spec))
    jx = count_lines(jax_text(model, spec))
    return {"lazyxla": lazy, "jax.jit": jx, "ratio": lazy / jx}


def table(sizes: dict[str, dict[str, float]]) -> str:
    """The (h) table: per model, the StableHLO lines of lazyxla's warm step and of jax.value_and_grad's."""
    rows = [[model, str(r["lazyxla"]), str(r["jax.jit"]), R.fmt(r["ratio"])] for model, r in sizes.items()]
    notes = [
        "lazyxla: the program of its third training step (lazy mode, zero_grad() after step()); jax: the jitted",
        "jax.value_and_grad step with the same optimizer (benchmarks/jax_models.py). Lines of the module's text.",
        "Lines per aten op: python -m benchmarks.program_size MODEL.",
    ]
    return R.table("(h) program size: StableHLO lines of a warm training step", ["model", "lazyxla", "jax", "x jax"],
                   rows, notes)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Command line: ``python -m benchmarks.program_size [mlp|gpt] [--quick] [--top N]``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="gpt", choices=S.MODELS)
    parser.add_argument("--quick", action="store_true", help="the quick settings' sizes")
    parser.add_argument("--top", type=int, default=25, help="op families shown")
    args = parser.parse_args(argv)

    spec = (S.Settings.quick() if args.quick else S.Settings.full()).spec(args.model)
    scoped = lazyxla_text(args.model, spec, scoped=True)
    plain, jx = lazyxla_text(args.model, spec), jax_text(args.model, spec)
    lazy_n, jax_n = count_lines(plain), count_lines(jx)
    print(f"{args.model}: lazyxla {lazy_n} StableHLO lines, jax.value_and_grad {jax_n}, ratio {lazy_n / jax_n:.3f}")
    print("\nlazyxla lines per aten op:")
    for op, n in list(breakdown(scoped).items())[: args.top]:
        print(f"  {n:6d}  {op}")
    lk, jk = op_kinds(plain), op_kinds(jx)
    print("\nlines per StableHLO op kind (lazyxla / jax):")
    for kind in sorted(set(lk) | set(jk), key=lambda k: -max(lk.get(k, 0), jk.get(k, 0)))[: args.top]:
        print(f"  {lk.get(kind, 0):6d} {jk.get(kind, 0):6d}  {kind}")


if __name__ == "__main__":
    main()
