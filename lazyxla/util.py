"""Small helpers every layer uses: atomic file writes, nested-tensor mapping, warn-once, bounded memo tables.

The bottom of the package (with ``config``, ``ir`` and ``ops``): it imports nothing from lazyxla.

Example::

    from lazyxla.util import Memo, atomic_write, map_tensors, warn_once
    atomic_write("run/state.bin", payload)
    on_cpu = map_tensors(state, lambda t: t.cpu())
    warn_once("my-key", "lazyxla: said once per process")
    seen = Memo("mymodule._seen", limit=1000)        # a bounded memo table; reset_all() empties every one
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import re
import secrets
import socket
import sys
import time
import warnings
import weakref
from collections.abc import Callable
from itertools import islice
from typing import Any, BinaryIO

import torch

from lazyxla.config import UNSUPPORTED_VERSIONS_VARIABLE


def contiguous_strides(shape) -> tuple[int, ...]:
    """The strides of a row-major tensor of ``shape`` (PyTorch's: a dimension of size 0 or 1 counts as 1).

    Example::

        contiguous_strides((2, 3, 4))     # (12, 4, 1)
    """
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def map_tensors(obj: Any, fn) -> Any:
    """``fn`` applied to every tensor in nested dicts, lists and tuples (containers keep their type).

    Example::

        on_cpu = map_tensors(state, lambda t: t.cpu())
    """
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        items = [(k, map_tensors(v, fn)) for k, v in obj.items()]
        try:
            return type(obj)(items)
        except TypeError:  # a dict subclass with another constructor (defaultdict, ...)
            return dict(items)
    if isinstance(obj, (list, tuple)):
        items = [map_tensors(v, fn) for v in obj]
        if hasattr(obj, "_fields"):  # a namedtuple
            return type(obj)(*items)
        return type(obj)(items) if type(obj) in (list, tuple) else items
    return obj


# Temporary files of atomic_write: ".<target>.tmp.<pid>.<8 hex>.<host>", so that one left by a killed writer
# can be told apart from one being written (by its pid on this host) and removed by the next writer.
_TEMP = re.compile(r"^\.(?P<target>.+)\.tmp\.(?P<pid>\d+)\.[0-9a-f]{8}\.(?P<host>[A-Za-z0-9-]+)$")
_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32] or "host"
_TARGET_CHARS = 120  # of the target's name in a temporary file's name (file names are limited to 255 bytes)
STALE_TEMP_S = 24 * 3600  # a temporary file this old is stale whoever wrote it (another host's writer, say)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def remove_stale_temps(folder: str | os.PathLike, target: str | None = None) -> int:
    """Remove the temporary files that killed :func:`atomic_write` calls left in ``folder``; how many.

    A temporary file is stale when its writer, a process on this host, is no longer running, or when it
    is older than ``STALE_TEMP_S`` (a writer on another host sharing the folder). With ``target`` (a file
    name in ``folder``) only that file's temporary files are considered. Files not named as
    ``atomic_write`` names them are never touched.

    Example::

        remove_stale_temps("run")                 # every file's
        remove_stale_temps("run", "ckpt.pt")      # only those of run/ckpt.pt
    """
    prefix = None if target is None else target[:_TARGET_CHARS]
    removed = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    now = time.time()
    for entry in entries:
        m = _TEMP.match(entry.name)
        if m is None or (prefix is not None and m["target"] != prefix):
            continue
        try:
            old = now - entry.stat(follow_symlinks=False).st_mtime > STALE_TEMP_S
            if old or (m["host"] == _HOST and not _alive(int(m["pid"]))):
                os.remove(entry.path)
                removed += 1
        except OSError:  # removed meanwhile by another cleaner, or not ours to remove
            pass
    return removed


def _create_temp(folder: str, target: str) -> tuple[int, str]:
    """A new private (0600) temporary file for ``target`` in ``folder``: (descriptor, path)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(100):
        name = f".{target[:_TARGET_CHARS]}.tmp.{os.getpid()}.{secrets.token_hex(4)}.{_HOST}"
        path = os.path.join(folder, name)
        try:
            return os.open(path, flags, 0o600), path
        except FileExistsError:  # another writer drew the same random part: draw again
            continue
    raise FileExistsError(f"lazyxla: could not create a temporary file for {target} in {folder}")


def require_parent_folder(path: str | os.PathLike, caller: str) -> None:
    """Raise torch.save's error (its type and words) when ``path``'s folder does not exist: a save through
    :func:`atomic_write` would otherwise fail with a FileNotFoundError naming its temporary file, a file the user
    never asked for.

    Example::

        require_parent_folder("run/ckpt.pt", "lazyxla.save")   # RuntimeError: Parent directory .../run does not exist.
    """
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    if not os.path.isdir(folder):
        raise RuntimeError(f"Parent directory {folder} does not exist. ({caller} creates no folders.)")


def atomic_write(path: str | os.PathLike, data: bytes | Callable[[BinaryIO], None], replace: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part.
    ``data`` is bytes, or a function that writes to the file object it is given (``torch.save`` into it): when it
    raises, ``path`` is left as it was.

    A temporary file in the same folder (``.<name>.tmp.<pid>.<random>.<host>``, created with O_EXCL, mode
    0600) is written and fsynced, then renamed over ``path``, and the folder is fsynced so the rename
    survives a crash. The temporary files of ``path`` that killed writers left behind are removed first
    (:func:`remove_stale_temps`). With ``replace=False`` an existing ``path`` is kept and
    ``FileExistsError`` raised (the file is published with a hard link, which never replaces).

    Example::

        atomic_write("run/state.bin", payload)
        atomic_write("run/secret", key, replace=False)     # only if no other process wrote it first
        atomic_write("ckpt.pt", lambda f: torch.save(state, f))
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    target = os.path.basename(path)
    remove_stale_temps(folder, target)
    fd, tmp = _create_temp(folder, target)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
            os.remove(tmp)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    try:
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# ---- bounded memo tables ----

_memos: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # name -> Memo, for ``reset_all``


class Memo:
    """A memo table: a plain ``dict`` (``table``) of at most ``limit`` entries, registered by ``name`` so
    ``reset_all`` empties it.

    Reads go to ``table`` itself (``get``, ``[]``, ``in``): a lookup on the per-op recording path is a plain
    dict's (CPython specializes calls on an exact ``dict`` only; a dict subclass's ``get`` costs ~10 ns more).
    ``remember`` is the one way in: when the table is full, its oldest entries by insertion (a quarter of
    ``limit``, at least one) leave first, so keys that keep changing (shapes, signatures) cannot grow it
    forever, and a lookup never reorders anything. A memo holds only what can be computed again: dropping any
    entry changes nothing but speed.

    Example::

        _routes = Memo("lazyxla.lazy.record._routes", limit=20_000)   # one entry per op
        route = _routes.table.get(id(func)) or _routes.remember(id(func), _route(func))
        seen = Memo("mymodule._seen", limit=100)
        if key not in seen.table:
            seen.remember(key)                                           # a set: the value is True
    """

    __slots__ = ("name", "limit", "table", "__weakref__")

    def __init__(self, name: str, limit: int) -> None:
        if type(limit) is not int or limit < 1:
            raise ValueError(f"Memo {name!r}: limit must be a positive int (entries), got {limit!r}")
        self.name = name
        self.limit = limit
        self.table: dict = {}
        _memos[name] = self

    def remember(self, key, value=True):
        """Store ``value`` under ``key`` (the oldest entries leave first if the table is full); returns ``value``.

        Example::

            h = memo.table.get(key) or memo.remember(key, compute(key))
        """
        table = self.table
        if len(table) >= self.limit:
            self._evict()
        table[key] = value
        return value

    def _evict(self) -> None:
        # a quarter at once: each eviction scans the deleted slots at the dict's front, so evicting one at a time
        # from a full table of 100,000 would cost a scan per insertion; pop, not del: a key may have left meanwhile
        # (a weak reference's callback, special._host_copies)
        table = self.table
        for key in list(islice(table, max(1, self.limit // 4))):
            table.pop(key, None)

    def clear(self) -> None:
        """Drop every entry (the table stays the same dict object)."""
        self.table.clear()

    def __len__(self) -> int:
        return len(self.table)

    def __repr__(self) -> str:
        return f"Memo({self.name!r}, limit={self.limit}, entries={len(self.table)})"


def memos() -> dict[str, Memo]:
    """Every live memo table by name (``Memo``).

    Example::

        sizes = {name: len(m) for name, m in memos().items()}
    """
    return dict(_memos)


def reset_all() -> int:
    """Empty every memo table (``Memo``) in the process; returns how many entries were dropped.

    Only speed changes: each entry is computed again the next time it is needed. For tests that want a cold
    start, and for a long-lived process that wants the memory of calls it will not make again back.

    Example::

        from lazyxla.util import reset_all
        reset_all()
    """
    dropped = 0
    for memo in list(_memos.values()):
        dropped += len(memo)
        memo.clear()
    return dropped


_warned: set[str] = set()  # keys already warned about in this process


def warn_once(key: str, message: str, category: type[Warning] = UserWarning, stacklevel: int = 1) -> None:
    """``warnings.warn(message, category)`` the first time ``key`` is seen in this process, else nothing.

    ``stacklevel`` counts from the caller, as for ``warnings.warn`` called there (1: the caller's line).
    Keys are namespaced by their user (``"cache:read"``, ``"fallback:aten.foo"``).

    Example::

        warn_once("cache:write", "lazyxla: could not write to the cache", RuntimeWarning)
    """
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, category, stacklevel=stacklevel + 1)


def moved_module(old: str, module, use: str) -> None:
    """Make the deprecated module ``old`` (running its own code now) the moved ``module`` itself, and warn once.

    Called by the alias modules kept for one release at a moved module's old name: ``import old`` then gives
    the moved module, every name (private ones too) included, and one ``DeprecationWarning`` naming ``use``
    at the importing line.

    Example::

        moved_module(__name__, autocast, "lazyxla.frontend.autocast")    # in lazyxla/autocast.py
    """
    warn_once("moved:" + old, f"{old} is deprecated: use {use}", DeprecationWarning, stacklevel=3)
    sys.modules[old] = module


def require_version(package: str, version: str, supported: tuple[tuple[int, int], tuple[int, int]]) -> None:
    """Raise ``ImportError`` unless ``version`` of ``package`` is within ``supported``, an inclusive range of
    (major, minor) pairs: lazyxla's modules that read private names of torch and jax check this first.

    Example::

        >>> require_version("torch", "2.12.1+cpu", ((2, 13), (2, 14)))
        ImportError: lazyxla supports torch 2.13 to 2.14, but torch 2.12.1+cpu is installed; ...

    With ``LAZYXLA_ALLOW_UNSUPPORTED_VERSIONS=1`` in the environment it warns instead (a trial of that release).
    """
    major, minor = (int(p) for p in version.split("+")[0].split(".")[:2])
    lo, hi = supported
    if lo <= (major, minor) <= hi:
        return
    if os.environ.get(UNSUPPORTED_VERSIONS_VARIABLE) == "1":
        # the user's own trial of a release lazyxla was not checked against (e.g. an accelerator image's torch):
        # a private name that moved then fails where it is read, and this warning says why
        warnings.warn(
            f"lazyxla supports {package} {lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}, but {package} {version} is installed "
            f"and {UNSUPPORTED_VERSIONS_VARIABLE}=1 lets it run unchecked: errors may come from {package}'s private "
            "names that lazyxla reads",
            RuntimeWarning,
            stacklevel=2,
        )
        return
    raise ImportError(
        f"lazyxla supports {package} {lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}, but {package} {version} is installed; "
        f"install a supported release, e.g. pip install '{package}=={lo[0]}.{lo[1]}.*' (or set "
        f"{UNSUPPORTED_VERSIONS_VARIABLE}=1 to try this one unchecked)"
    )


class _AfterImport(importlib.abc.MetaPathFinder):
    """The finder ``after_import`` installs: runs ``hooks[name](module)`` right after module ``name`` is first
    imported, and leaves ``sys.meta_path`` once every hook has run."""

    def __init__(self) -> None:
        self.hooks: dict[str, Callable] = {}

    def find_spec(self, name, path, target=None):
        hook = self.hooks.pop(name, None)
        if hook is None:
            return None
        if not self.hooks and self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader

        class Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                hook(module)

        spec.loader = Loader()
        return spec


_after_import = _AfterImport()


def after_import(hooks: dict[str, Callable]) -> None:
    """Run ``hooks[name](module)`` for each module name: now if the module is loaded, else right after it is first
    imported (so a library lazyxla adapts, Dynamo or transformers, costs nothing until the user imports it).

    Example::

        after_import({"transformers.modeling_utils": patch})     # patch(module), now or at its import
    """
    for name, hook in hooks.items():
        module = sys.modules.get(name)
        if module is not None:
            hook(module)
        else:
            _after_import.hooks[name] = hook
    if _after_import.hooks and _after_import not in sys.meta_path:
        sys.meta_path.insert(0, _after_import)
