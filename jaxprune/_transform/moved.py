"""Whether weights the masks prune have moved off zero since the last step.

Every step leaves the weights its masks prune at exactly zero (`-params` updates,
docs/explanation/semantics.md#applying-the-masks), so at the next mask update they still
are unless something after the transform changed them: a transform chained after it, or
params edited outside the step. `any_moved`, run at each mask update, feeds
`PruningState.moved_updates`, which the accessors warn on
(docs/explanation/semantics.md#order-in-an-optax-chain).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import Array, lax


@jax.jit
def _pruned_magnitude(mask: Array, param: Array) -> Array:
  """The largest |param| where `mask` is False, NaN ignored (0.0 when there is none).

  In one pass that stores nothing: XLA:CPU fuses no compare or select into the input
  of a reduction, so `jnp.any(~mask & (p != 0))` would first store a bool array the
  size of the weights. A reduce of two operands, |p| and the mask as a float, takes
  them as they are read and does the select in its combiner: an element (a, kept)
  enters as 0 where kept or NaN, as a elsewhere, and partial results carry kept = 0.
  """

  magnitude = jnp.abs(param).astype(jnp.float32)
  kept = mask.astype(jnp.float32)
  zero = jnp.float32(0.0)
  reduced = lax.reduce((magnitude, kept), (zero, zero), _combine, tuple(range(param.ndim)))
  # XLA treats the init as the combiner's identity and returns a lone element as it is,
  # never combined: (0, 0) is the identity only up to this reading, so read the result
  # the way an entering element is read (a (1, 1) kernel kept would count as moved).
  return _entering(*reduced)


def _entering(value: Array, kept: Array) -> Array:
  """What an element or partial result (|p|, kept) stands for: 0 where kept or NaN."""
  return jnp.where(jnp.isnan(value) | (kept > 0), jnp.float32(0.0), value)


def _combine(x: tuple[Array, Array], y: tuple[Array, Array]) -> tuple[Array, Array]:
  """`_pruned_magnitude`'s combiner (one function, so JAX traces it once for all leaves)."""
  return jnp.maximum(_entering(*x), _entering(*y)), jnp.float32(0.0)


def any_moved(masks: list[Array], params: list[Array]) -> Array:
  """Whether a pruned entry of `params` is nonzero (NaN aside): each step leaves the
  entries its masks prune at exactly zero, so at the next step they still are
  unless something after the transform changed them."""
  largest = [_pruned_magnitude(mask, p) for mask, p in zip(masks, params, strict=True)]
  return functools.reduce(jnp.maximum, largest, jnp.float32(0.0)) > 0
