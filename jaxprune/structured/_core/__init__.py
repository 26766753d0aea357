"""The core every part of the structured pass builds on: the jaxpr evaluator, the
product primitives' axes, the graph and the plan (private; the public names are in
`jaxprune.structured`). It imports no other folder of structured."""

__all__ = []
