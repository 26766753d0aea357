"""`prune`: the three stages in one call, for Flax Linen and NNX models (private)."""

__all__ = []
