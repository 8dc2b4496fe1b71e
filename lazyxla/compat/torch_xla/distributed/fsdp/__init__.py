"""``torch_xla.distributed.fsdp`` on lazyxla: fully sharded data parallelism over replicas (FSDP v1).

``XlaFullyShardedDataParallel`` shards a module's parameters over the ``xmp.spawn`` replicas (see its module);
``wrap`` has the auto-wrap policies; ``checkpoint_module`` recomputes a module's forward in backward;
``consolidate_sharded_state_dicts`` / ``consolidate_sharded_model_checkpoints`` rebuild the unwrapped model's
state dict from every replica's shards (also ``python -m torch_xla.distributed.fsdp.consolidate_sharded_ckpts``).

Example::

    from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP, checkpoint_module
    model = FSDP(checkpoint_module(MyModel()))
"""

from lazyxla.compat.torch_xla.distributed.fsdp.state_dict_utils import (
    consolidate_sharded_model_checkpoints,
    consolidate_sharded_state_dicts,
)
from lazyxla.compat.torch_xla.distributed.fsdp.utils import checkpoint_module
from lazyxla.compat.torch_xla.distributed.fsdp.xla_fully_sharded_data_parallel import XlaFullyShardedDataParallel

__all__ = [
    "XlaFullyShardedDataParallel",
    "checkpoint_module",
    "consolidate_sharded_model_checkpoints",
    "consolidate_sharded_state_dicts",
]
