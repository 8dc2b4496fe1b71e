"""Which of torch_xla's public Python API the compatibility layer provides: a table of module, name and status.

The names come from a copy of pytorch/xla's source (``$TORCH_XLA_SRC/torch_xla``, read with ``ast``: nothing of
it is imported or copied): a module's ``__all__`` when it has one, else its public top-level functions and
classes (and, for ``xla_env_vars``, its constants). Each is looked up in ``lazyxla.compat.torch_xla``:

* **implemented** — the layer has it (``PARTIAL`` notes where it differs from torch_xla);
* **partial** — the layer has the name but it raises ``NotImplementedError`` naming what to use instead, or
  ``PARTIAL`` says what part is missing;
* **missing** — the layer has no such name, with the reason (``MODULE_REASONS`` / ``NAME_REASONS``).

Usage::

    python -m lazyxla.tools.torch_xla_api                 # the table, as markdown, on stdout
    python -m lazyxla.tools.torch_xla_api --update-doc    # into docs/migrating-from-torch_xla.md's section
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib
import os
from pathlib import Path

from lazyxla.util import atomic_write

DOC = Path(__file__).resolve().parents[2] / "docs" / "migrating-from-torch_xla.md"
BEGIN, END = "<!-- torch_xla-api:begin -->", "<!-- torch_xla-api:end -->"

# torch_xla's public modules (its user guide's), and the file each one's names are read from.
MODULES = {
    "torch_xla": "torch_xla/torch_xla.py",  # `from .torch_xla import *` in torch_xla/__init__.py
    "torch_xla.runtime": "torch_xla/runtime.py",
    "torch_xla.core.xla_model": "torch_xla/core/xla_model.py",
    "torch_xla.core.functions": "torch_xla/core/functions.py",
    "torch_xla.core.xla_builder": "torch_xla/core/xla_builder.py",
    "torch_xla.core.xla_env_vars": "torch_xla/core/xla_env_vars.py",
    "torch_xla.core.dynamo_bridge": "torch_xla/core/dynamo_bridge.py",
    "torch_xla.debug.metrics": "torch_xla/debug/metrics.py",
    "torch_xla.debug.metrics_compare_utils": "torch_xla/debug/metrics_compare_utils.py",
    "torch_xla.debug.profiler": "torch_xla/debug/profiler.py",
    "torch_xla.distributed.parallel_loader": "torch_xla/distributed/parallel_loader.py",
    "torch_xla.distributed.xla_multiprocessing": "torch_xla/distributed/xla_multiprocessing.py",
    "torch_xla.distributed.xla_backend": "torch_xla/distributed/xla_backend.py",
    "torch_xla.distributed.spmd": "torch_xla/distributed/spmd/__init__.py",
    "torch_xla.distributed.spmd.xla_sharding": "torch_xla/distributed/spmd/xla_sharding.py",
    "torch_xla.distributed.spmd.debugging": "torch_xla/distributed/spmd/debugging.py",
    "torch_xla.distributed.spmd.api": "torch_xla/distributed/spmd/api.py",
    "torch_xla.distributed.spmd.xla_sharded_tensor": "torch_xla/distributed/spmd/xla_sharded_tensor.py",
    "torch_xla.distributed.fsdp": "torch_xla/distributed/fsdp/__init__.py",
    "torch_xla.distributed.fsdp.wrap": "torch_xla/distributed/fsdp/wrap.py",
    "torch_xla.distributed.zero_redundancy_optimizer": "torch_xla/distributed/zero_redundancy_optimizer.py",
    "torch_xla.amp": "torch_xla/amp/__init__.py",
    "torch_xla.amp.syncfree": "torch_xla/amp/syncfree/__init__.py",
    "torch_xla.utils.utils": "torch_xla/utils/utils.py",
    "torch_xla.utils.checkpoint": "torch_xla/utils/checkpoint.py",
    "torch_xla.utils.serialization": "torch_xla/utils/serialization.py",
    "torch_xla.experimental": "torch_xla/experimental/__init__.py",
    "torch_xla.experimental.scan": "torch_xla/experimental/scan.py",
    "torch_xla.experimental.scan_layers": "torch_xla/experimental/scan_layers.py",
    "torch_xla.experimental.spmd_fully_sharded_data_parallel": (
        "torch_xla/experimental/spmd_fully_sharded_data_parallel.py"
    ),
    "torch_xla.experimental.gradient_accumulation": "torch_xla/experimental/gradient_accumulation.py",
    "torch_xla.experimental.deprecation": "torch_xla/experimental/deprecation.py",
    "torch_xla.test.test_utils": "torch_xla/test/test_utils.py",
    "torch_xla.experimental.distributed_checkpoint": "torch_xla/experimental/distributed_checkpoint/__init__.py",
    "torch_xla.experimental.custom_kernel": "torch_xla/experimental/custom_kernel.py",
    "torch_xla.experimental.assume_pure": "torch_xla/experimental/assume_pure.py",
    "torch_xla.experimental.xla_quantized_matmul": "torch_xla/experimental/xla_quantized_matmul.py",
    "torch_xla.stablehlo": "torch_xla/stablehlo.py",
}
# Why a module the layer does not have is missing (the issue-17 points name work another part of the project does).
MODULE_REASONS = {
    "torch_xla.core.dynamo_bridge": "torch.compile(backend='openxla'): issue 17 point 4",
    "torch_xla.distributed.fsdp": "FSDP v1: issue 17 point 2",
    "torch_xla.distributed.fsdp.wrap": "FSDP v1: issue 17 point 2",
    "torch_xla.distributed.zero_redundancy_optimizer": "ZeRO-1: issue 17 point 2",
    "torch_xla.utils.checkpoint": "gradient checkpointing: issue 17 point 2",
    "torch_xla.utils.serialization": "tensor-by-tensor checkpoint files; not provided (xm.save / torch.save)",
    "torch_xla.experimental.scan": "issue 17 point 3",
    "torch_xla.experimental.scan_layers": "issue 17 point 3",
    "torch_xla.experimental.spmd_fully_sharded_data_parallel": "FSDPv2: issue 17 point 2",
}
NAME_REASONS = {
    ("torch_xla.experimental", "eager_mode"): "issue 17 point 4",
    ("torch_xla.experimental", "is_eager_mode"): "issue 17 point 4",
    ("torch_xla.experimental", "eager_mode_context"): "issue 17 point 4",
}
_SHARDED_TENSOR = "no padding; autograd records on the wrapped tensor"  # both import paths of the one class
_FIXED_SHAPES = "fixed shapes: dynamic dimensions (torch.export.Dim) raise, naming them"
_PAGED = "an exact XLA formulation on every platform (not the TPU Pallas kernel); padding rows are zeros"
_AUTO = "a fixed policy (parameters split on their first dimension the devices divide) stands for XLA's auto-sharding"

# Names the layer has that do less than torch_xla's (what differs is in docs/migrating-from-torch_xla.md).
PARTIAL = {
    ("torch_xla.core.xla_model", "add_step_closure"): "run_async=True runs the closure synchronously",
    ("torch_xla.core.xla_model", "rendezvous"): "every replica takes part (no subset of replicas)",
    ("torch_xla.core.xla_model", "xla_rendezvous"): "every replica takes part (no subset of replicas)",
    ("torch_xla.distributed.parallel_loader", "ParallelLoader"): "one device per process",
    ("torch_xla.debug.profiler", "trace"): "needs xprof (pip install xprof)",
    ("torch_xla.debug.profiler", "trace_detached"): "needs xprof (pip install xprof)",
    ("torch_xla.debug.metrics", "metrics_report"): "lazyxla's metrics; torch_xla's C++ ones are absent",
    ("torch_xla.distributed.spmd", "XLAShardedTensor"): _SHARDED_TENSOR,
    ("torch_xla.distributed.spmd.xla_sharded_tensor", "XLAShardedTensor"): _SHARDED_TENSOR,
    ("torch_xla.distributed.spmd", "auto_policy"): _AUTO,
    ("torch_xla.distributed.spmd.api", "auto_policy"): _AUTO,
    ("torch_xla.experimental.distributed_checkpoint", "CheckpointManager"): "local or mounted folders (no fsspec URL)",
    ("torch_xla.stablehlo", "exported_program_to_stablehlo"): _FIXED_SHAPES,
    ("torch_xla.stablehlo", "save_as_stablehlo"): _FIXED_SHAPES,
    ("torch_xla.stablehlo", "save_torch_model_as_stablehlo"): _FIXED_SHAPES,
    ("torch_xla.stablehlo", "StableHLOExportOptions"): "inline_all_constant has no effect (scalars are inlined); "
    "custom_ops_allowed_in_graph and export_node_metadata raise",
    ("torch_xla.stablehlo", "XLAExportInterpreter"): "custom_ops_allowed_in_graph and gm_serializer raise",
    ("torch_xla.core.xla_builder", "call_jax"): "name and override_hash are ignored (lazyxla keys by signature)",
    ("torch_xla.experimental.custom_kernel", "flash_attention"): "jax's Pallas TPU kernel on a TPU (lengths in "
    "128-blocks, SPMD off), else an exact XLA formulation (O(len^2) memory); partition_spec/mesh unused (XLA "
    "partitions the XLA formulation from the shardings)",
    ("torch_xla.experimental.custom_kernel", "quantized_matmul_int8"): "an exact XLA formulation on every platform "
    "(torch_xla's Pallas kernel is its own); zero_point and quant_block_size raise, as that kernel asserts",
    ("torch_xla.experimental.custom_kernel", "gmm"): "jax.lax.ragged_dot; group_offset raises",
    ("torch_xla.experimental.custom_kernel", "paged_attention"): _PAGED,
    ("torch_xla.experimental.custom_kernel", "multi_queries_paged_attention"): _PAGED,
    ("torch_xla.experimental.custom_kernel", "ragged_paged_attention"): _PAGED + "; torch_xla's host-side runtime "
    "check (q_len <= kv_len, ...) is not made: it would read the lengths on the host",
    ("torch_xla.experimental.custom_kernel", "tgmm"): "exact XLA; group_offset and num_actual_groups raise",
    ("torch_xla.experimental.assume_pure", "assume_pure"): "a one-iteration lazyxla.scan kept per signature, not "
    "a call_jax call (xb._jax_to_xla_computation_cache_elements does not count it)",
    ("torch_xla.experimental.custom_kernel", "FlashAttention"): "apply only (flash_attention's positional form)",
}


def public_names(source: Path) -> list[str]:
    """The public names of one torch_xla module's source: what it defines at the top level (functions, classes,
    constants with a literal value) and, for a package, imports from its own submodules; narrowed to its
    ``__all__`` when every entry of that is one of these (``distributed/spmd``'s has two names run together).

    Example::

        public_names(Path(os.environ["TORCH_XLA_SRC"]) / "torch_xla/runtime.py")
    """
    tree = ast.parse(source.read_text(encoding="utf-8"))
    defined, exported = set(), None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name) and t.id.isupper())
        elif isinstance(node, ast.ImportFrom) and node.level > 0 and source.name == "__init__.py":
            defined.update(a.asname or a.name for a in node.names)  # `from .x import a`: the package's surface
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            exported = set(ast.literal_eval(node.value))
    if exported is not None and exported <= defined:
        defined = exported
    return sorted(n for n in defined if not n.startswith("_"))


def _compat_module(name: str):
    try:
        return importlib.import_module("lazyxla.compat." + name)
    except ModuleNotFoundError:
        return None


def _is_stub(obj) -> bool:
    return (getattr(obj, "__doc__", None) or "").startswith("Not supported on lazyxla")


def status(module: str, name: str, compat) -> tuple[str, str]:
    """``(status, note)`` of ``module.name`` in the layer (``compat``: the layer's module or None).

    Example::

        status("torch_xla.runtime", "world_size", importlib.import_module("lazyxla.compat.torch_xla.runtime"))
    """
    if compat is None:
        return "missing", MODULE_REASONS.get(module, "not provided")
    try:
        obj = getattr(compat, name)
    except AttributeError:
        return "missing", NAME_REASONS.get((module, name), "not provided")
    if _is_stub(obj):
        return "partial", "raises NotImplementedError naming the lazyxla alternative"
    if (module, name) in PARTIAL:
        return "partial", PARTIAL[(module, name)]
    return "implemented", ""


def table(src: Path) -> list[tuple[str, str, str, str]]:
    """``(module, name, status, note)`` for every public name of ``MODULES`` in the source at ``src``.

    Example::

        rows = table(Path(os.environ["TORCH_XLA_SRC"]))
    """
    rows = []
    for module, path in MODULES.items():
        source = src / path
        if not source.exists():
            continue
        compat = _compat_module(module)
        for name in public_names(source):
            rows.append((module, name, *status(module, name, compat)))
    return rows


def markdown(rows: list[tuple[str, str, str, str]]) -> str:
    """The counts per status, then one line per module: its names grouped by status, with the notes.

    Example::

        print(markdown(table(src)))
    """
    counts = collections.Counter(r[2] for r in rows)
    lines = [
        f"{len(rows)} public names in {len({r[0] for r in rows})} modules: {counts['implemented']} implemented, "
        f"{counts['partial']} partial, {counts['missing']} missing.",
        "",
        "| module | implemented | partial | missing (reason) |",
        "| --- | --- | --- | --- |",
    ]
    by_module: dict = collections.defaultdict(list)
    for row in rows:
        by_module[row[0]].append(row)
    for module, entries in by_module.items():
        cells = []
        for kind in ("implemented", "partial", "missing"):
            names = [(n, note) for _, n, s, note in entries if s == kind]
            if kind == "missing" and len(names) == len(entries) > 12:  # a whole module: its size and why
                cells.append(f"all {len(names)} names ({names[0][1]})")
                continue
            cells.append(_cell(names, kind))
        lines.append(f"| `{module}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(names: list[tuple[str, str]], kind: str) -> str:
    if not names:
        return ""
    if kind == "implemented":
        return ", ".join(f"`{n}`" for n, _ in names)
    notes: dict = collections.defaultdict(list)
    for n, note in names:
        notes[note].append(f"`{n}`")
    return "; ".join(f"{', '.join(ns)} ({note})" if note else ", ".join(ns) for note, ns in notes.items())


def write_section(doc: Path, begin: str, end: str, text: str) -> None:
    """Replace what lies between the markers ``begin`` and ``end`` in ``doc`` with ``text``.

    Example::

        write_section(DOC, BEGIN, END, markdown(table(src)))
    """
    content = doc.read_text(encoding="utf-8")
    if begin not in content or end not in content:
        raise SystemExit(f"{doc} has no {begin} ... {end} section to update")
    head, rest = content.split(begin, 1)
    _, tail = rest.split(end, 1)
    atomic_write(doc, f"{head}{begin}\n{text}\n{end}{tail}".encode())


def main(argv: list[str] | None = None) -> None:
    """The command line (see the module's docstring).

    Example::

        main(["--update-doc"])
    """
    parser = argparse.ArgumentParser(prog="python -m lazyxla.tools.torch_xla_api", description=__doc__.split("\n")[0])
    parser.add_argument("--src", default=os.environ.get("TORCH_XLA_SRC"), help="pytorch/xla checkout ($TORCH_XLA_SRC)")
    parser.add_argument("--update-doc", action="store_true", help=f"write the table into {DOC.name}")
    args = parser.parse_args(argv)
    if not args.src or not (Path(args.src) / "torch_xla").is_dir():
        parser.error("set TORCH_XLA_SRC (or --src) to a pytorch/xla checkout holding torch_xla/")
    text = markdown(table(Path(args.src)))
    if args.update_doc:
        write_section(DOC, BEGIN, END, text)
    else:
        print(text)


if __name__ == "__main__":
    main()
