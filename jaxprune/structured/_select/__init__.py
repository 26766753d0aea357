"""Stage 2, select: score channels and choose which go, as a plan (private)."""

__all__ = []
