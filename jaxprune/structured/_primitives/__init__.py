"""The primitives table: per primitive, how it ties channels, how it runs at pruned
shapes and what it costs (private; register rules with `jaxprune.structured`)."""

__all__ = []
