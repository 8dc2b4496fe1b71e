"""Many devices: replica collectives, SPMD sharding, torch.distributed, launch, training helpers, data."""
