"""The package's import direction (docs/architecture.md, "Packages and the layering rule").

Every lazyxla module belongs to a layer, declared once in ``LAYERS``; a module imports only modules of its own
layer or of lower ones (``parallel`` and ``frontend`` are siblings: neither imports the other); the import
graph has no cycle; an import inside a function says why on its line (a comment). Checked on the source with
``ast``: every ``import``, at module level or in a function, counts.
"""

from __future__ import annotations

import ast
import io
import os
import subprocess
import sys
import textwrap
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Module, or package (and everything under it) -> layer. The longest matching name wins; "lazyxla" names only
# the package's own __init__ (the public face).
LAYERS = {
    "lazyxla.config": "base",
    "lazyxla.util": "base",
    "lazyxla.ir": "base",
    "lazyxla.ops": "base",
    "lazyxla.observe": "observe",
    "lazyxla.device": "device",
    "lazyxla.lowering": "lowering",
    "lazyxla.lazy": "lazy",
    "lazyxla.parallel": "parallel",
    "lazyxla.frontend": "frontend",
    "lazyxla.compat": "top",
    "lazyxla.tools": "top",
    # public faces: thin re-exports of the implementation modules
    "lazyxla": "top",
    "lazyxla.debug": "top",
    "lazyxla.dynamo": "top",
    "lazyxla.metrics": "top",
    "lazyxla.profiler": "top",
    "lazyxla.run": "top",
    "lazyxla.runtime": "top",
    "lazyxla.spmd": "top",
    # deprecated aliases of moved modules (kept for one release)
    "lazyxla.autocast": "top",
    "lazyxla.collectives": "top",
    "lazyxla.data": "top",
    "lazyxla.regions": "top",
    "lazyxla.stablehlo": "top",
    "lazyxla.device.distributed": "top",
    "lazyxla.device.runtime": "top",
}
RANK = {"base": 0, "observe": 1, "device": 2, "lowering": 3, "lazy": 4, "parallel": 5, "frontend": 5, "top": 6}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str, layers: dict[str, str]) -> str | None:
    """The layer ``module`` belongs to: its own entry, else its nearest package's (not the bare root's)."""
    parts = module.split(".")
    for k in range(len(parts), 0, -1):
        name = ".".join(parts[:k])
        if name in layers and (k == len(parts) or k > 1):
            return layers[name]
    return None


def _commented_lines(source: str) -> set[int]:
    return {t.start[0] for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT}


def _imports(tree: ast.Module, module: str, is_package: bool, known: set[str]):
    """(node, target module, inside a function) for every import of a package module in ``tree``."""
    inside = set()
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside.update(id(n) for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom)))
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - n.level + 1]
                base = ".".join(package + ([n.module] if n.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in n.names]
        else:
            continue
        for name in dict.fromkeys(names):
            while name and name not in known:  # `import lazyxla.x.y` imports the module x.y (or its package)
                name = name.rpartition(".")[0]
            if name:
                yield n, name, id(n) in inside


def check(root: Path, layers: dict[str, str] = LAYERS, rank: dict[str, int] = RANK) -> list[str]:
    """Every violation of the layering rule in the package under ``root`` (``root/lazyxla``), as
    ``file:line: rule: ...`` lines; empty when the package keeps the rule."""
    files = {_module_name(p, root): p for p in sorted((root / "lazyxla").rglob("*.py"))}
    known = set(files)
    problems, edges = [], {}
    for module, path in files.items():
        where = path.relative_to(root)
        layer = layer_of(module, layers)
        if layer is None:
            problems.append(f"{where}:1: unlisted module: {module} has no layer; add it to LAYERS in {__file__}")
            continue
        source = path.read_text()
        comments = _commented_lines(source)
        for node, target, in_function in _imports(ast.parse(source), module, path.name == "__init__.py", known):
            edges.setdefault(module, {}).setdefault(target, f"{where}:{node.lineno}")
            if in_function and not comments & set(range(node.lineno, (node.end_lineno or node.lineno) + 1)):
                problems.append(
                    f"{where}:{node.lineno}: import inside a function without a comment saying why: "
                    f"{ast.unparse(node)}"
                )
            other = layer_of(target, layers)
            if other is None or target == module:
                continue
            if rank[other] > rank[layer]:
                problems.append(
                    f"{where}:{node.lineno}: upward import: {module} ({layer}) imports {target} ({other}); "
                    "a module imports only its own layer or lower ones"
                )
            elif rank[other] == rank[layer] and other != layer:
                problems.append(
                    f"{where}:{node.lineno}: sibling import: {module} ({layer}) imports {target} ({other}); "
                    f"{layer} and {other} never import each other"
                )
    problems += [f"{edges[c[0]][c[1]]}: import cycle: {' -> '.join(c)}" for c in _cycles(edges)]
    return problems


def _cycles(edges: dict[str, dict[str, str]]) -> list[list[str]]:
    """One cycle per strongly connected group of modules that import each other (a DFS back edge)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(edges.get(start, ())))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                found.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(edges.get(nxt, ()))))
    return found


def test_the_package_keeps_its_layers():
    problems = check(ROOT)
    assert not problems, "\n".join(problems)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_the_check_names_each_violation_with_its_file_and_line(tmp_path):
    _write(
        tmp_path,
        {
            "lazyxla/__init__.py": "",
            "lazyxla/config.py": "",
            "lazyxla/device/__init__.py": "",
            "lazyxla/device/devices.py": "from lazyxla.lazy import graph\n",  # device imports lazy: upward
            "lazyxla/lazy/__init__.py": "",
            "lazyxla/lazy/graph.py": (
                "import lazyxla.lazy.record\n"  # record imports graph back: a cycle
                "def f():\n"
                "    from lazyxla import config\n"  # no comment
                "def g():\n"
                "    from lazyxla import config  # a reason\n"
            ),
            "lazyxla/lazy/record.py": "from lazyxla.lazy.graph import f\n",
            "lazyxla/parallel/__init__.py": "",
            "lazyxla/parallel/spmd.py": "from lazyxla.frontend import kernels\n",  # sibling layers
            "lazyxla/frontend/__init__.py": "",
            "lazyxla/frontend/kernels.py": "from lazyxla.device.devices import x\n",  # downward: fine
            "lazyxla/newthing.py": "",  # in no layer
        },
    )
    problems = check(tmp_path)
    expected = [
        "lazyxla/device/devices.py:1: upward import: lazyxla.device.devices (device) imports lazyxla.lazy.graph (lazy)",
        "lazyxla/lazy/graph.py:3: import inside a function without a comment saying why: from lazyxla import config",
        "lazyxla/parallel/spmd.py:1: sibling import: lazyxla.parallel.spmd (parallel) imports "
        "lazyxla.frontend.kernels (frontend)",
        "lazyxla/newthing.py:1: unlisted module: lazyxla.newthing has no layer",
        "import cycle: lazyxla.lazy.graph -> lazyxla.lazy.record -> lazyxla.lazy.graph",
    ]
    for text in expected:
        assert any(text in p for p in problems), f"{text!r} not in:\n" + "\n".join(problems)
    assert len(problems) == len(expected), "\n".join(problems)
    assert any(p.startswith("lazyxla/lazy/graph.py:1: import cycle") for p in problems), problems


# The module names lazyxla had before the package was laid out in layers: each still imports (for one release),
# is the moved module itself, and warns once that it is deprecated; the public faces do not warn.
_OLD_NAMES = r"""
import importlib, sys, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import lazyxla
    faces = {"lazyxla.dynamo": "lazyxla_backend", "lazyxla.profiler": "trace", "lazyxla.runtime": "world_size",
             "lazyxla.spmd": "mark_sharding", "lazyxla.metrics": "counters", "lazyxla.debug": "ir_text"}
    for name, attr in faces.items():
        assert hasattr(importlib.import_module(name), attr), name
    assert not [w for w in caught if issubclass(w.category, DeprecationWarning) and "lazyxla" in str(w.message)]
moved = {
    "lazyxla.stablehlo": "lazyxla.frontend.export", "lazyxla.collectives": "lazyxla.parallel.collectives",
    "lazyxla.data": "lazyxla.parallel.data", "lazyxla.regions": "lazyxla.lazy.regions",
    "lazyxla.autocast": "lazyxla.frontend.autocast", "lazyxla.device.runtime": "lazyxla.device.devices",
    "lazyxla.device.distributed": "lazyxla.device.processes",
}
for old, new in moved.items():
    with warnings.catch_warnings(record=True) as caught:
        if old.count(".") == 1:  # lazyxla.autocast & co. after a plain `import lazyxla`, as before the move
            assert getattr(lazyxla, old.split(".")[1]) is sys.modules[new], old
        module = importlib.import_module(old)
    assert module is sys.modules[new], (old, module)
    said = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(said) == 1 and old in str(said[0].message), (old, [str(w.message) for w in caught])
from lazyxla.stablehlo import export
from lazyxla.collectives import all_reduce, ReduceOp
from lazyxla.data import DeviceLoader
from lazyxla.regions import compile
from lazyxla.device.runtime import jax_device, to_device
from lazyxla.device.distributed import world_size, _backend_started
assert lazyxla.autocast.policy("matmul") == "lower_precision_fp"
print("ok")
"""


def test_old_module_names_still_import_and_warn_once():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-c", _OLD_NAMES], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_the_torch_compile_entry_point_names_an_importable_backend():
    import pkgutil

    import lazyxla.frontend.dynamo

    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.entry-points.torch_dynamo_backends]", 1)[1].split("[", 1)[0]
    target = section.split("lazyxla =", 1)[1].split("\n", 1)[0].strip().strip('"')
    assert pkgutil.resolve_name(target) is lazyxla.frontend.dynamo.lazyxla_backend
