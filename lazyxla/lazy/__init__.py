"""Lazy tensors: recording ops, the live-tensor list, sync, RNG, checks at the call, compile regions."""
