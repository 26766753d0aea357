"""`prune`: the three stages in one call, for Flax models and plain functions (private)."""

__all__ = []
