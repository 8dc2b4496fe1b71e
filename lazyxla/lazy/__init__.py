"""Lazy tensors, the IR, recording, sync and metrics."""
