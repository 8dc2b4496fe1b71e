"""Lowering rules: random ops."""
