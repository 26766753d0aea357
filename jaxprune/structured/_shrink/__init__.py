"""Stage 3, shrink: apply a plan (smaller variables, the pruned callable), verify it
against the dense model and rebuild Flax modules at the new sizes (private)."""

__all__ = []
