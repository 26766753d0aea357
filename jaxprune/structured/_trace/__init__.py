"""Stage 1, trace: a model's functions into one graph of coupled channel groups (private)."""

__all__ = []
