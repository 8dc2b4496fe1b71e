"""Replica collectives and SPMD sharding (see the replicas and SPMD issues); nothing here yet."""
