"""jaxprune: gradual magnitude pruning and structured channel pruning for JAX."""

from jaxprune.names import leaf_name, named_leaves, tree_names

# -- core engine (SPEC.md) --

# -- additions from other modules (one import line each) --
