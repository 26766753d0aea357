"""The primitives table: per primitive, how it ties channels, how it runs at pruned
shapes and what it costs; and what reads the table: the one traversal of jaxprs, the
FLOPs counter and the observer (private; register rules with `jaxprune.structured`)."""

__all__ = []
