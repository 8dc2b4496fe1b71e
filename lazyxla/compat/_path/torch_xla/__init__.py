"""Bootstrap for processes that did not call ``lazyxla.compat.install()`` themselves.

``lazyxla.compat.install()`` appends this package's parent folder to ``sys.path``. A process started by
``multiprocessing`` receives that ``sys.path`` and re-imports the parent's script before running anything
else; when the script says ``import torch_xla``, this package is what it finds: it installs the
compatibility layer in the new process and hands over to ``lazyxla.compat.torch_xla``.

Example::

    # nothing to call: `python -m lazyxla.run script.py` and xmp.spawn's replicas use it
"""

import importlib
import sys

__lazyxla_compat__ = True

from lazyxla import compat as _compat  # noqa: E402

if not _compat.install():
    raise ImportError(
        f"lazyxla.compat: a real torch_xla is installed ({_compat.real_torch_xla()}); remove "
        f"{_compat.PATH_DIR} from sys.path / PYTHONPATH to use it"
    )
sys.modules[__name__] = importlib.import_module("lazyxla.compat.torch_xla")
