"""``torch_xla._internal`` on lazyxla: the runtime helpers libraries import from torch_xla's private package.

Lightning (``torch_xla._internal.tpu.num_available_devices`` for ``accelerator="tpu"``/``"auto"``,
``tpu.get_tpu_env`` for its FLOPs table) and torch_xla's own tests import ``tpu``, ``pjrt``, ``gpu``,
``utils`` and ``rendezvous`` from here. Each module keeps torch_xla's names and signatures, mapped onto lazyxla;
what describes TPU hardware (PCI chips, the TPU VM's metadata) reads the host as torch_xla does.

Example::

    from torch_xla._internal import tpu, pjrt
    print(tpu.num_available_devices())       # the XLA devices this host's processes can drive
"""

from lazyxla.compat._common import missing_attribute


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
