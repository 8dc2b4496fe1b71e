"""Lowering rules: view ops."""
