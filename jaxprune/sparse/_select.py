"""Mask primitives of sparse training: random masks and the drop-and-grow step.

Each works on one leaf flattened, inside jit, with `lax.top_k` on a static
count instead of a full sort of the leaf: SET's and RigL's drop/grow counts
are a fraction of the kept entries (3% of the leaf at 90% sparsity and drop
fraction 0.3). Ties follow jaxprune's one rule (`jaxprune._masks.ranking`, `lax.top_k`'s
order, from which RigL's code keeps its weights too): among equal scores the lower
flat index ranks higher, so it is kept first and grown first, and masks are
deterministic.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array

from jaxprune._masks import ranking as ranking


def top_k_mask(scores: Array, k: int) -> Array:
  """A bool mask of `scores`' shape keeping its `k` highest entries (ties: lower index)."""
  flat = scores.reshape(-1)
  if k >= flat.size:
    return jnp.ones(scores.shape, bool)
  indices = ranking.highest_k_indices(flat, k)
  return jnp.zeros(flat.shape, bool).at[indices].set(True).reshape(scores.shape)


def random_mask(key: Array, shape: tuple[int, ...], k: int) -> Array:
  """A uniformly random bool mask of `shape` with exactly `k` True entries."""
  return top_k_mask(jax.random.uniform(key, shape), k)


def drop_and_grow(
  mask: Array, drop_scores: Array, grow_scores: Array, n_drop: Array, max_drop: int
) -> Array:
  """Drops the `n_drop` kept entries of lowest `drop_scores`, then grows as many.

  The grown entries are those of highest `grow_scores` among the entries not
  kept after the drop (so a just-dropped entry may come back, as in RigL).
  The number of kept entries is unchanged. Ties: of equal drop scores the higher
  index is dropped first, of equal grow scores the lower index grows first.

  Args:
    mask: bool, the current mask; it must keep at least `max_drop` entries.
    drop_scores: float, mask's shape; the entries to drop are the lowest
      (e.g. weight magnitudes).
    grow_scores: float, mask's shape; the entries to grow are the highest
      (e.g. gradient magnitudes for RigL, uniform noise for SET).
    n_drop: int32 scalar in [0, max_drop] (traced).
    max_drop: static bound on `n_drop`: the size of the two top-k calls.

  Returns:
    The new bool mask.
  """
  if max_drop == 0:
    return mask
  flat = mask.reshape(-1)
  selected = jnp.arange(max_drop) < n_drop
  inf = jnp.array(jnp.inf, jnp.float32)
  droppable = jnp.where(flat, drop_scores.reshape(-1).astype(jnp.float32), inf)
  kept = flat.at[ranking.lowest_k_indices(droppable, max_drop)].set(~selected)
  candidates = jnp.where(kept, -inf, grow_scores.reshape(-1).astype(jnp.float32))
  grown = jnp.zeros_like(flat).at[ranking.highest_k_indices(candidates, max_drop)].set(selected)
  return (kept | grown).reshape(mask.shape)
