"""``python -m lazyxla.run script.py [args]``: run a torch_xla script unmodified on lazyxla.

The torch_xla compatibility layer is installed (``lazyxla.compat.install()``: ``import torch_xla...``
resolves to ``lazyxla.compat.torch_xla``), then the script runs as ``__main__`` with ``sys.argv`` set to
``[script, *args]`` and its folder first on ``sys.path`` in place of the current folder, as ``python
script.py`` has it (so a ``helper.py`` or a ``torch_xla/`` folder in the current folder is not imported
in place of the script's own). ``-m module`` runs a module instead, with the current folder first, as
``python -m module`` has it. Processes the script starts get the layer too: ``multiprocessing`` children
(``xmp.spawn``'s replicas, DataLoader workers) through ``sys.path``, other Python children through
``PYTHONPATH``. If a real torch_xla is installed it is left alone: the script runs with it (a note
says so on stderr).

Example::

    python -m lazyxla.run train_mnist.py --batch-size 64
    CPU_NUM_DEVICES=2 python -m lazyxla.run train_mp_mnist.py     # xmp.spawn: 2 replicas on CPU
    CPU_NUM_DEVICES=8 python -m lazyxla.run train_spmd.py         # SPMD over 8 CPU devices
"""

from __future__ import annotations

import os
import runpy
import sys

from lazyxla import compat
from lazyxla.config import FLAGS, foreign_env
from lazyxla.device import devices

_DEVICE_NAME_VARIABLE = next(f.env for f in FLAGS if f.name == "device_name")  # LAZYXLA_DEVICE_NAME
USAGE = "usage: python -m lazyxla.run script.py [args ...]\n       python -m lazyxla.run -m module [args ...]"


def _export_path(path: str) -> None:
    """Append ``path`` to ``PYTHONPATH`` for child interpreters (once)."""
    parts = [p for p in foreign_env("PYTHONPATH").split(os.pathsep) if p]
    if path not in [os.path.abspath(p) for p in parts]:
        os.environ["PYTHONPATH"] = os.pathsep.join([*parts, path])


def _put_script_folder_first(script: str, replace_cwd: bool) -> None:
    """``sys.path`` as ``python script.py`` has it: the script's folder (symbolic links resolved) first, and
    with ``replace_cwd``, instead of the current folder that ``python -m`` put there (unless ``-P`` /
    ``PYTHONSAFEPATH`` kept it out), so that a module or a ``torch_xla/`` folder in the current folder is
    not imported in place of the script's own."""
    folder = os.path.dirname(os.path.realpath(script))
    first = sys.path[0] if sys.path else None
    if replace_cwd and not sys.flags.safe_path and first is not None and os.path.abspath(first or ".") == os.getcwd():
        sys.path[0] = folder
    else:
        sys.path.insert(0, folder)


def main(argv: list[str] | None = None) -> None:
    """Install the compatibility layer and run ``argv`` (``script.py args...`` or ``-m module args...``).

    Example::

        lazyxla.run.main(["train.py", "--epochs", "1"])
    """
    command = argv is None  # `python -m lazyxla.run ...`: sys.path[0] is the folder python put there for -m
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        raise SystemExit(2 if not argv else 0)
    script = None
    if argv[0] != "-m":
        script = os.path.abspath(argv[0])
        if not os.path.exists(script):
            print(f"lazyxla.run: can't open file {argv[0]!r}: no such file", file=sys.stderr)
            raise SystemExit(2)
        # before install() looks for a real torch_xla: the script's sys.path, not the current folder's
        _put_script_folder_first(script, replace_cwd=command)

    if compat.install():
        os.environ[_DEVICE_NAME_VARIABLE] = devices.torch_name()  # children name the device as this process does
        _export_path(compat.PATH_DIR)
        # the bootstrap package imports lazyxla: children must find it even if this process found it in its cwd
        _export_path(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(compat.__file__)))))
    else:
        real = compat.real_torch_xla()
        print(f"lazyxla.run: a real torch_xla is installed ({real}); running with it", file=sys.stderr)

    if argv[0] == "-m":
        if len(argv) < 2:
            print(USAGE, file=sys.stderr)
            raise SystemExit(2)
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    sys.argv = [argv[0], *argv[1:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
