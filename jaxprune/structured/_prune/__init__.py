"""`prune`: the three stages in one call for Flax Linen, NNX and plain functions (private)."""

__all__ = []
