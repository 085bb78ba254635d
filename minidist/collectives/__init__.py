"""Collectives built from point-to-point steps (interface documented in the next commit)."""
