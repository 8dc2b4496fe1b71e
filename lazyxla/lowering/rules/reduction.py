"""Lowering rules: reduction ops."""
