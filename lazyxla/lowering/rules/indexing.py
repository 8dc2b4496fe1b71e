"""Lowering rules: indexing ops."""
