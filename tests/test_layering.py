"""The package's import direction (docs/architecture.md, "Packages and the layering rule").

Every lazyxla module belongs to a layer, declared once in ``LAYERS``; a module imports only modules of its own
layer or of lower ones (``parallel`` and ``frontend`` are siblings: neither imports the other); the import
graph has no cycle; an import inside a function says why on its line (a comment). Checked on the source with
``ast``: every ``import``, at module level or in a function, counts.

Private PyTorch and jax names are read only by ``lazyxla.torch_private`` and ``lazyxla.jax_private``
(``PRIVATE_API_OWNERS``); ``private_uses`` finds any other module that reads one.
"""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
import textwrap
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Module, or package (and everything under it) -> layer. The longest matching name wins; "lazyxla" names only
# the package's own __init__ (the public face).
LAYERS = {
    "lazyxla.config": "base",
    "lazyxla.util": "base",
    "lazyxla.ir": "base",
    "lazyxla.ops": "base",
    "lazyxla.torch_private": "base",
    "lazyxla.jax_private": "base",
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
    "lazyxla.lightning": "top",
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
                    f"{where}:{node.lineno}: import inside a function without a comment saying why: {ast.unparse(node)}"
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


# ---- private PyTorch and jax names ------------------------------------------------------------------------

# The only modules that read private PyTorch / jax names; each checks the versions it was written against.
PRIVATE_API_OWNERS = ("lazyxla.torch_private", "lazyxla.jax_private")
_PRIVATE_ROOTS = ("torch", "jax", "jaxlib")
# Private attributes other modules may read, each with its reason: an attribute name, or "module.name".
PRIVATE_ALLOWED = {
    "_schema": "OpOverload._schema, an op's arguments and returns: PyTorch has no public accessor (its own "
    "decompositions read it), and lazyxla's routing reads it per op, where a call through torch_private would cost",
    "_overloadname": "OpOverload._overloadname, the overload's name ('default', 'Tensor'): as _schema",
    "sys._getframe": "a documented Python function (the user's frame, for diagnostics)",
    "os._exit": "a documented Python function (a child process ends without cleanup)",
}
_DOTTED = re.compile(r"(torch|jax|jaxlib)(\.\w+)+")


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_name(dotted: str) -> bool:
    """Whether ``dotted``, a name in torch, jax or jaxlib, is private: it has a ``_`` part (ops such as
    ``torch.ops.aten._softmax`` are public), or it is in jaxlib (whose ``__version__`` only is public)."""
    parts = dotted.split(".")
    if parts[0] not in _PRIVATE_ROOTS or parts[:2] == ["torch", "ops"]:
        return False
    return any(map(_is_private, parts[1:])) or (parts[0] == "jaxlib" and len(parts) > 1 and parts[1] != "__version__")


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for an expression that is not a dotted name."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return [node.id, *reversed(names)] if isinstance(node, ast.Name) else None


def _root(node: ast.AST) -> str:
    """The name a dotted expression starts from (``torch`` for ``torch._C.x``); "" for any other expression."""
    return (_chain(node) or [""])[0]


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> the torch/jax/jaxlib name it stands for (imports, and ``aten = torch.ops.aten``)."""
    found: dict[str, str] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                if a.name.split(".")[0] in _PRIVATE_ROOTS:
                    found[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(n, ast.ImportFrom) and not n.level and (n.module or "").split(".")[0] in _PRIVATE_ROOTS:
            found.update({a.asname or a.name: f"{n.module}.{a.name}" for a in n.names})
    for n in tree.body:
        chain = _chain(n.value) if isinstance(n, ast.Assign) else None
        if chain and chain[0] in found:
            found.update({t.id: ".".join([found[chain[0]], *chain[1:]]) for t in n.targets if isinstance(t, ast.Name)})
    return found


def _own_names(trees: dict[str, ast.Module]) -> set[str]:
    """Every name lazyxla defines (modules, functions, classes, variables, attributes it sets on its objects)."""
    own = {module.rpartition(".")[2] for module in trees}
    for tree in trees.values():
        aliases = _aliases(tree)
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(n.name)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                own.add(n.id)
            elif isinstance(n, ast.alias) and n.asname:
                own.add(n.asname)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and _root(n) not in aliases:
                own.add(n.attr)  # (not `torch.x._y = ...`: that is torch's name)
            elif isinstance(n, ast.Call) and ast.unparse(n.func).endswith(("setattr", "__setattr__")):
                own.update(a.value for a in n.args[1:2] if isinstance(a, ast.Constant))
    return own


def _private_reads(tree: ast.Module, own: set[str]):
    """(line, what) for each private torch/jax name ``tree`` reads."""
    aliases = _aliases(tree)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    strings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}  # docstrings may name anything
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            yield from ((n.lineno, a.name) for a in n.names if _private_name(a.name))
        elif isinstance(n, ast.ImportFrom) and not n.level and n.module:
            yield from ((n.lineno, f"{n.module}.{a.name}") for a in n.names if _private_name(f"{n.module}.{a.name}"))
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in strings:
            if _DOTTED.fullmatch(n.value) and _private_name(n.value):
                yield n.lineno, repr(n.value)
        elif isinstance(n, ast.Attribute):
            chain = _chain(n)
            if chain and chain[0] in aliases:
                dotted = ".".join([aliases[chain[0]], *chain[1:]])
                if id(n) not in inner and _private_name(dotted):
                    yield n.lineno, dotted
            elif _is_private(n.attr) and n.attr not in own and not {n.attr, ast.unparse(n)} & PRIVATE_ALLOWED.keys():
                yield n.lineno, f"{ast.unparse(n)}, an attribute lazyxla does not define"


def private_uses(root: Path, owners: tuple[str, ...] = PRIVATE_API_OWNERS) -> list[str]:
    """Every read of a private PyTorch or jax name outside ``owners``, as ``file:line: ...`` lines.

    A private name is a ``_`` part in a name reached from ``torch``, ``jax`` or ``jaxlib`` (through imports and
    aliases such as ``aten = torch.ops.aten``; ops are public), a string naming one, or a private attribute
    that no lazyxla module defines (``array._arrays``: an attribute of a jax or torch object), unless
    ``PRIVATE_ALLOWED`` names it.
    """
    files = {_module_name(p, root): p for p in sorted((root / "lazyxla").rglob("*.py"))}
    trees = {m: ast.parse(p.read_text()) for m, p in files.items()}
    own = _own_names({m: t for m, t in trees.items() if m not in owners})
    problems = []
    for module, tree in trees.items():
        if module in owners:
            continue
        for line, what in sorted(set(_private_reads(tree, own))):
            problems.append(
                f"{files[module].relative_to(root)}:{line}: private API: {what}; read it through "
                f"{' or '.join(owners)} (the only modules that touch private torch/jax names)"
            )
    return problems


def test_only_the_owner_modules_read_private_torch_and_jax_names():
    problems = private_uses(ROOT)
    assert not problems, "\n".join(problems)


def test_the_private_api_check_names_each_read(tmp_path):
    _write(
        tmp_path,
        {
            "lazyxla/__init__.py": "",
            "lazyxla/torch_private.py": "import torch\nfrom torch._C import _x\nis_functional = torch._is_functional\n",
            "lazyxla/a.py": (
                '"""Mentions torch._C in a docstring: fine."""\n'
                "import torch\n"
                "import torch.utils._pytree as pytree\n"  # 3: a private module
                "from jax._src import xla_bridge\n"  # 4
                "aten = torch.ops.aten\n"
                "x = aten._softmax.default\n"  # an op: public
                "y = torch._C.DispatchKey.Functionalize\n"  # 7: reported once, whole
                "z = x._schema\n"  # allowed
                "def f(a):\n"
                "    return a._arrays\n"  # 10: a jax.Array's
                "def g(t):\n"
                "    return t._mine\n"  # lazyxla's own (set below)
                "class C:\n"
                "    def __init__(self):\n"
                "        self._mine = 1\n"
                "name = 'torch._dynamo.trace_rules'\n"  # 16: a string naming a private module
                "import jaxlib\n"
                "v = jaxlib.__version__\n"
                "w = jaxlib.xla_client\n"  # 19
            ),
        },
    )
    problems = private_uses(tmp_path)
    expected = [
        "lazyxla/a.py:3: private API: torch.utils._pytree;",
        "lazyxla/a.py:4: private API: jax._src.xla_bridge;",
        "lazyxla/a.py:7: private API: torch._C.DispatchKey.Functionalize;",
        "lazyxla/a.py:10: private API: a._arrays, an attribute lazyxla does not define;",
        "lazyxla/a.py:16: private API: 'torch._dynamo.trace_rules';",
        "lazyxla/a.py:19: private API: jaxlib.xla_client;",
    ]
    for text in expected:
        assert any(p.startswith(text) for p in problems), f"{text!r} not in:\n" + "\n".join(problems)
    assert len(problems) == len(expected), "\n".join(problems)


def test_the_private_api_modules_refuse_versions_they_were_not_checked_against():
    from lazyxla import jax_private, torch_private

    torch_private.check_torch_version("2.13.0+cpu")
    jax_private.check_jax_version("0.10.2")
    with pytest.raises(ImportError, match=r"lazyxla supports torch 2.13 to 2.14, but torch 2.12.1 is installed"):
        torch_private.check_torch_version("2.12.1")
    with pytest.raises(ImportError, match=r"lazyxla supports jax 0.10 to 0.10, but jax 0.11.0 is installed"):
        jax_private.check_jax_version("0.11.0")


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


def test_an_unsupported_version_runs_as_a_trial_with_a_warning_when_asked(monkeypatch):
    from lazyxla import jax_private
    from lazyxla.config import unknown_variables

    monkeypatch.setenv("LAZYXLA_ALLOW_UNSUPPORTED_VERSIONS", "1")
    with pytest.warns(RuntimeWarning, match=r"jax 0.11.2 is installed and LAZYXLA_ALLOW_UNSUPPORTED_VERSIONS=1"):
        jax_private.check_jax_version("0.11.2")
    assert unknown_variables({"LAZYXLA_ALLOW_UNSUPPORTED_VERSIONS": "1"}) == []
    monkeypatch.setenv("LAZYXLA_ALLOW_UNSUPPORTED_VERSIONS", "0")
    with pytest.raises(ImportError, match=r"or set LAZYXLA_ALLOW_UNSUPPORTED_VERSIONS=1 to try this one unchecked"):
        jax_private.check_jax_version("0.11.2")
