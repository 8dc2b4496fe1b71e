"""``lazyxla.compat``: run torch_xla scripts unmodified on lazyxla.

``lazyxla.compat.torch_xla`` holds modules with torch_xla's public names and signatures
(``torch_xla``, ``torch_xla.core.xla_model``, ``torch_xla.runtime``, ``torch_xla.distributed.*``,
``torch_xla.debug.metrics``, ``torch_xla.amp``, ...), each a thin mapping onto lazyxla. :func:`install`
makes ``import torch_xla...`` resolve to them, but only when the real torch_xla is not importable: a real
installation is never shadowed. ``python -m lazyxla.run script.py [args]`` runs a script with the layer
installed (see ``docs/migrating-from-torch_xla.md``).

How ``install`` works:

* a finder at the front of ``sys.meta_path`` answers ``torch_xla`` and ``torch_xla.<sub>`` with the module
  ``lazyxla.compat.torch_xla.<sub>`` itself (one module object under both names, so module state such as
  step closures is shared);
* a folder holding a tiny ``torch_xla`` bootstrap package is appended to ``sys.path``. Processes started by
  ``multiprocessing`` (``xmp.spawn``'s replicas, DataLoader workers under the spawn or forkserver start
  methods) receive the parent's ``sys.path`` and re-import the script before anything else runs: there,
  ``import torch_xla`` finds the bootstrap package, which installs the finder in that process too;
* the device's name is not ``install``'s to choose: PyTorch names its device once per process, when
  ``import lazyxla`` registers it, which asks :func:`device_name`: ``xla`` under ``python -m lazyxla.run`` or
  with ``LAZYXLA_DEVICE_NAME=xla`` (so ``torch.device("xla")`` and ``t.device.type == "xla"`` mean lazyxla's
  device), else ``lazyxla``;
* torch_xla's PJRT variables are read once: ``PJRT_DEVICE`` (``CPU``, ``CUDA``/``GPU``, ``TPU``) selects
  jax's platform unless ``JAX_PLATFORMS`` is set, and ``CPU_NUM_DEVICES`` gives the process that many CPU
  devices (``lazyxla.config.cpu_devices``) unless that is set, as torch_xla's CPU client does.

Example::

    import lazyxla.compat
    if lazyxla.compat.install():
        import torch_xla.core.xla_model as xm      # lazyxla.compat.torch_xla.core.xla_model
        dev = xm.xla_device()          # torch.device('lazyxla', 0): the name chosen at `import lazyxla`
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import sys

# jax sets TPU_SKIP_MDS_QUERY=1 in this process's environment when imported on a host without TPU chips (its
# cloud_tpu_init), and child processes inherit it. torch_xla's code reads the variable as the user's description of
# a TPU VM (torch_xla._internal.tpu.get_tpu_env answers from variables then, where off a TPU VM it fails), so the
# layer leaves the variable as jax found it (below). jax reads it again only on a TPU VM, where it does not set it.
# (`import lazyxla` imports jax here first.)
_TPU_SKIP_MDS_QUERY_GIVEN = os.environ.get("TPU_SKIP_MDS_QUERY")

import jax  # noqa: E402

from lazyxla.config import config, foreign_env  # noqa: E402
from lazyxla.device.devices import DEVICE_NAMES  # noqa: E402
from lazyxla.device.processes import _backend_started  # noqa: E402

if _TPU_SKIP_MDS_QUERY_GIVEN is None:
    os.environ.pop("TPU_SKIP_MDS_QUERY", None)
else:  # jax writes "1" over the user's value
    os.environ["TPU_SKIP_MDS_QUERY"] = _TPU_SKIP_MDS_QUERY_GIVEN

__all__ = ["API_VERSION", "PATH_DIR", "device_name", "install", "installed", "real_torch_xla", "uninstall"]

API_VERSION = "2.8.0"
"""The torch_xla release whose Python API the layer follows (PJRT era): ``torch_xla.__version__`` and what
``importlib.metadata.version("torch_xla")`` answer while the layer is installed (with a ``+lazyxla`` tag)."""

_HERE = os.path.dirname(os.path.abspath(__file__))
PATH_DIR = os.path.join(_HERE, "_path")
"""The folder whose ``torch_xla`` bootstrap package lets child processes import the layer."""

_PREFIX = "lazyxla.compat."
_RUN_MODULE = "lazyxla.run"
_state: dict = {"finder": None, "env_applied": False}


def _ours(origin: str | None) -> bool:
    return bool(origin) and os.path.abspath(origin).startswith(_HERE + os.sep)


def _is_torch_xla_name(fullname: str) -> bool:
    return fullname == "torch_xla" or fullname.startswith("torch_xla.")


class _AliasLoader(importlib.abc.Loader):
    """Loads ``torch_xla.X`` as the already importable ``lazyxla.compat.torch_xla.X`` (the same object)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self.spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # The target module ran when it was imported; the import system has just replaced its __spec__
        # with the alias's: give it back, so the module keeps describing itself as lazyxla.compat's.
        module.__spec__ = self.spec


def distribution_version() -> str:
    """The version the layer's ``torch_xla`` distribution reports: :data:`API_VERSION` with a local tag naming
    lazyxla (PEP 440, so version gates such as ``torch_xla>=2.5`` compare the API level).

    Example::

        print(lazyxla.compat.distribution_version())     # 2.8.0+lazyxla0.1.0
    """
    # the parent package is loaded whenever this one is (no import: lazyxla's __init__ imports this package)
    return f"{API_VERSION}+lazyxla{sys.modules['lazyxla'].__version__}"


def _normalized(name: str) -> str:
    """A distribution name as importlib.metadata compares them (PEP 503: runs of ``-_.`` are one ``_``)."""
    return re.sub(r"[-_.]+", "_", name).lower()


class _Distribution(importlib.metadata.Distribution):
    """The layer's ``torch_xla`` distribution: metadata only (no files, no requirements)."""

    def read_text(self, filename):
        if filename != "METADATA":
            return None
        return (
            "Metadata-Version: 2.1\nName: torch_xla\n"
            f"Version: {distribution_version()}\n"
            "Summary: torch_xla's Python API over lazyxla (lazyxla.compat), not a torch_xla installation\n"
        )

    def locate_file(self, path):
        return os.path.join(_HERE, "torch_xla", str(path))


def _real_distribution(context, finder) -> bool:
    """Whether a finder other than ``finder`` knows a ``torch_xla`` distribution (a real install)."""
    for other in sys.meta_path:
        find = getattr(other, "find_distributions", None)
        if other is finder or find is None:
            continue
        try:
            if next(iter(find(context)), None) is not None:
                return True
        except Exception:  # noqa: BLE001 - a third-party finder that cannot answer counts as not knowing it
            continue
    return False


class _Finder(importlib.abc.MetaPathFinder):
    """Answers ``torch_xla`` and its submodules with lazyxla's compatibility modules, and
    ``importlib.metadata``'s questions about the ``torch_xla`` distribution (libraries gate their torch_xla
    code paths on its version: Lightning's ``RequirementCache("torch_xla>=2.1")``)."""

    def find_distributions(self, context=None):
        # Only a question by name: listing every distribution (pip list, packages_distributions) stays truthful.
        # A real torch_xla distribution is never shadowed, even one whose module cannot be imported.
        name = getattr(context, "name", None)  # importlib.metadata passes a DistributionFinder.Context
        if name is None or _normalized(name) != "torch_xla" or _real_distribution(context, self):
            return iter(())
        return iter((_Distribution(),))

    def find_spec(self, fullname, path=None, target=None):
        if not _is_torch_xla_name(fullname):
            return None
        target_name = _PREFIX + fullname
        try:
            spec = importlib.util.find_spec(target_name)
        except ModuleNotFoundError:
            spec = None
        if spec is None:  # not provided: the import fails as usual (find_spec probes get None)
            return None
        return importlib.util.spec_from_loader(
            fullname, _AliasLoader(target_name), is_package=spec.submodule_search_locations is not None
        )


def real_torch_xla() -> str | None:
    """Where a real torch_xla would be imported from, or None when there is none.

    lazyxla's own modules (the compatibility layer and its bootstrap folder) do not count.

    Example::

        if lazyxla.compat.real_torch_xla():
            print("torch_xla is installed; lazyxla.compat stays out of its way")
    """
    loaded = sys.modules.get("torch_xla")
    if loaded is not None:
        origin = getattr(getattr(loaded, "__spec__", None), "origin", None) or getattr(loaded, "__file__", None)
        if not _ours(origin) and not getattr(loaded, "__lazyxla_compat__", False):
            return origin or repr(loaded)
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != PATH_DIR]
    for finder in sys.meta_path:
        if isinstance(finder, _Finder):
            continue
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find("torch_xla", path if finder is importlib.machinery.PathFinder else None)
        except Exception:  # a third-party finder that cannot answer for a top-level name
            spec = None
        if spec is not None and not _ours(spec.origin):
            locations = list(spec.submodule_search_locations or [])
            if spec.origin is None and locations and all(_ours(os.path.join(p, "x")) for p in locations):
                continue  # a namespace package made of lazyxla's own folders
            return spec.origin or (locations[0] if locations else "torch_xla")
    return None


def _started_by_run() -> bool:
    """Whether this interpreter runs ``python [options] -m lazyxla.run ...`` and is importing lazyxla on the way.

    While ``-m`` imports the module's package, ``sys.argv`` is ``["-m", *script_args]`` and ``sys.orig_argv``
    ends with the module's name (``lazyxla.run``, or glued: ``-mlazyxla.run``) followed by those arguments.
    """
    if sys.argv[:1] != ["-m"] or len(sys.orig_argv) <= len(sys.argv):
        return False
    token = sys.orig_argv[-len(sys.argv)]
    return token == _RUN_MODULE or (token.startswith("-") and token.endswith("m" + _RUN_MODULE))


def device_name() -> str:
    """The name lazyxla's device takes in this process (decided once, when lazyxla is imported): ``"xla"`` when
    ``lazyxla.config.device_name`` (``LAZYXLA_DEVICE_NAME``) says so or the process runs ``python -m lazyxla.run``,
    else ``"lazyxla"``. A real torch_xla owns ``"xla"``: with one importable the device stays ``"lazyxla"``
    (and an explicit ``LAZYXLA_DEVICE_NAME=xla`` raises).

    PyTorch names its PrivateUse1 device once per process, so a later ``install()`` cannot rename it: code that
    says ``torch.device("xla")`` runs where the name was chosen before ``import lazyxla``.

    Example::

        $ python -m lazyxla.run -c 'import torch; print(torch.zeros(1, device="xla").device)'   # xla:0
    """
    name = config.device_name
    if name not in DEVICE_NAMES:
        raise ValueError(f"LAZYXLA_DEVICE_NAME={name!r}: lazyxla's device can be named 'lazyxla' or 'xla'")
    if name == "lazyxla" and not _started_by_run():
        return name
    real = real_torch_xla()
    if real is None:
        return "xla"
    if name == "xla":
        raise RuntimeError(
            f"LAZYXLA_DEVICE_NAME=xla: a real torch_xla is installed ({real}) and owns PyTorch's 'xla' device; "
            "unset LAZYXLA_DEVICE_NAME (lazyxla's device is then 'lazyxla')"
        )
    return "lazyxla"


def installed() -> bool:
    """Whether :func:`install` is in effect in this process.

    Example::

        assert lazyxla.compat.installed()
    """
    return _state["finder"] is not None


def _apply_pjrt_environment() -> None:
    """torch_xla's PJRT variables, once per process, before jax starts a backend."""
    if _state["env_applied"]:
        return
    _state["env_applied"] = True
    if _backend_started():
        return
    device = foreign_env("PJRT_DEVICE").strip().upper()
    platform = {"CPU": "cpu", "CUDA": "cuda", "GPU": "cuda", "TPU": "tpu"}.get(device.split("_")[0])
    if platform and not foreign_env("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", platform)
    count = foreign_env("CPU_NUM_DEVICES").strip()
    if count.isdigit() and int(count) > 0 and config.cpu_devices == 0:
        config.cpu_devices = int(count)


def install() -> bool:
    """Make ``import torch_xla...`` resolve to lazyxla's compatibility modules; returns whether it did.

    Nothing changes, and False is returned, when a real torch_xla is importable (see
    :func:`real_torch_xla`): the layer never shadows it. Calling it again is a no-op. Processes started
    by ``multiprocessing`` from this one get the layer as well (through ``sys.path``); ``python -m
    lazyxla.run`` also exports it to other child interpreters through ``PYTHONPATH``.

    Example::

        import lazyxla.compat
        lazyxla.compat.install()
        import torch_xla
        import torch_xla.core.xla_model as xm
        print(xm.xla_device())            # lazyxla:0 here; xla:0 under python -m lazyxla.run
    """
    if _state["finder"] is not None:
        return True
    if real_torch_xla() is not None:
        return False
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    _state["finder"] = finder
    if PATH_DIR not in sys.path:
        sys.path.append(PATH_DIR)
    _apply_pjrt_environment()
    return True


def uninstall() -> None:
    """Undo :func:`install`: ``import torch_xla`` fails again (or finds a real one installed since).

    The compatibility modules stay importable as ``lazyxla.compat.torch_xla...``; only the ``torch_xla``
    names are removed from ``sys.modules``.

    Example::

        lazyxla.compat.uninstall()
        assert "torch_xla" not in sys.modules
    """
    finder = _state["finder"]
    _state["finder"] = None
    if finder is not None and finder in sys.meta_path:
        sys.meta_path.remove(finder)
    while PATH_DIR in sys.path:
        sys.path.remove(PATH_DIR)
    for name in [n for n in sys.modules if _is_torch_xla_name(n)]:
        module = sys.modules[name]
        if getattr(module, "__name__", "").startswith(_PREFIX) or getattr(module, "__lazyxla_compat__", False):
            del sys.modules[name]
    importlib.invalidate_caches()
