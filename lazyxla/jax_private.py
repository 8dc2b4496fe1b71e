"""Every private jax/jaxlib name lazyxla uses, in one place, behind the jax version check.

jax's public API covers most of what lazyxla needs; a few things it does not offer: whether a backend
has started, the coordination service's client, binding gloo's CPU collectives to the loopback address,
an array's per-device buffers and a sharding's device order and HLO form. These are read only here, each
bound to a public name of this module with a comment saying what lazyxla uses it for; every other lazyxla
module imports these (``tests/test_layering.py`` checks that no other module touches ``jax._src`` or
a private jax/jaxlib attribute). Moving to a new jax release means checking this file.

Checked against jax and jaxlib 0.10.2 (requirements.txt's pin); pyproject.toml accepts ``jax>=0.10.2,<0.11``
(``SUPPORTED_JAX``), and importing this module raises a clear ``ImportError`` outside that range, before any
private name is read.

Example::

    from lazyxla import jax_private
    if not jax_private.backend_started():
        jax.config.update("jax_num_cpu_devices", 8)
"""

from __future__ import annotations

import functools
import operator

import jax

from lazyxla.util import require_version

SUPPORTED_JAX = ((0, 10), (0, 10))  # inclusive range of major.minor (pyproject.toml); checked on 0.10.2

# raises ImportError, with what to install, for a jax version outside SUPPORTED_JAX: check_jax_version("0.9")
check_jax_version = functools.partial(require_version, "jax", supported=SUPPORTED_JAX)
check_jax_version(jax.__version__)  # before any private name below is read

from jax._src import distributed as _distributed  # noqa: E402  (loaded by `import jax`)
from jax._src import xla_bridge as _xla_bridge  # noqa: E402  (loaded by `import jax`)


def backend_started() -> bool:
    """Whether jax has started a backend in this process: joining a multi-process run, or setting the
    number of CPU devices, must happen before."""
    return bool(_xla_bridge._backends)


def coordination_client():
    """The client of jax's coordination service (its key-value store and barriers carry lazyxla's host-side
    rendezvous); None before ``jax.distributed.initialize``."""
    return _distributed.global_state.client


def gloo_on_loopback(client) -> None:
    """Make the CPU backend's gloo collectives listen on 127.0.0.1 (a single-host run) instead of the address
    the host name resolves to: the CPU backend factory is registered again with collectives made here (no jax
    setting does it). Raises AttributeError or TypeError where another jax version changed these."""
    from jax._src.lib import _jax  # private and version-dependent (gloo's constructor): imported only where used

    collectives = _jax.make_gloo_tcp_collectives(distributed_client=client, hostname="127.0.0.1")
    factory = functools.partial(_xla_bridge.make_cpu_client, collectives=collectives)
    _xla_bridge.register_backend_factory("cpu", factory, priority=0, fail_quietly=False)


# per program argument (each run checks its inputs): a jax.Array's per-device buffers (None once deleted),
# the one place where a buffer's own dtype can be seen
device_buffers = operator.attrgetter("_arrays")


def device_assignment(sharding: jax.sharding.Sharding) -> tuple:
    """The devices of ``sharding`` in its order (``device_set`` has none): part of a layout's canonical key."""
    return sharding._device_assignment


def hlo_sharding(sharding: jax.sharding.Sharding, ndim: int):
    """``sharding`` for an ``ndim``-dimensional array as XLA's HloSharding (its text is the canonical layout,
    equal for a NamedSharding and the GSPMDSharding a program returns)."""
    return sharding._to_xla_hlo_sharding(ndim)
