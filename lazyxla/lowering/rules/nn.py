"""Lowering rules: nn ops."""
