"""``torch_xla.experimental.distributed_checkpoint``: ``torch.distributed.checkpoint`` for SPMD tensors.

``SPMDSavePlanner`` / ``SPMDLoadPlanner`` let ``torch.distributed.checkpoint.save`` / ``load`` write and read a
state dict whose device tensors are split over the devices (each process writes the parts its devices hold,
once per part, and reads back whatever parts its devices need, so a checkpoint taken with one layout or mesh
loads into another); ``CheckpointManager`` keeps a checkpoint per step in a folder (interval, how many to keep,
asynchronous saves, a checkpoint when the process is told to stop); ``prime_optimizer`` creates an optimizer's
state so that a checkpoint can be loaded into it.

Example::

    import torch.distributed.checkpoint as dist_cp
    import torch_xla.experimental.distributed_checkpoint as xc
    dist_cp.save(model.state_dict(), storage_writer=dist_cp.FileSystemWriter(path), planner=xc.SPMDSavePlanner())
    state = model.state_dict()
    dist_cp.load(state, storage_reader=dist_cp.FileSystemReader(path), planner=xc.SPMDLoadPlanner())
"""

from lazyxla.compat.torch_xla.experimental.distributed_checkpoint.manager import CheckpointManager
from lazyxla.compat.torch_xla.experimental.distributed_checkpoint.planners import SPMDLoadPlanner, SPMDSavePlanner
from lazyxla.compat.torch_xla.experimental.distributed_checkpoint.util import prime_optimizer

__all__ = ["CheckpointManager", "SPMDLoadPlanner", "SPMDSavePlanner", "prime_optimizer"]
