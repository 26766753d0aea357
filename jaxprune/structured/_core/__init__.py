"""The core every stage of the structured pass builds on: jaxpr traversal and evaluation,
the graph, the plan and the FLOPs counter (private; the public names are in
`jaxprune.structured`)."""

__all__ = []
