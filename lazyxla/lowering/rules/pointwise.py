"""Lowering rules: pointwise ops."""
