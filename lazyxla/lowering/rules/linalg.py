"""Lowering rules: linalg ops."""
