"""The order in which jaxprune ranks entries by score, and the k lowest in it.

Entries rank by score, highest first; among equal scores the LOWER flat index ranks
higher. It is `lax.top_k`'s order (and `tf.math.top_k`'s, from whose order RigL's code
keeps its weights), so keeping the k highest keeps the lower indices of a tie, and
dropping the k lowest drops the HIGHER indices of a tie first. NaN ranks as the
largest value, -0.0 and 0.0 are equal. `jaxprune.methods` (`prune_lowest`), the N:M
masks and `jaxprune.sparse` (SET, RigL, random masks) rank by it.

`lowest_k_stable` is a second rule with the ties the other way round: the first k of a
stable ascending sort (numpy's `argsort(kind='stable')`, torch's `sort(stable=True)`).
`jaxprune.oneshot` prunes by it because Wanda's reference code does
(`torch.sort(scores, stable=True)`, then the first k of each row), and its tests match
that code's masks entry for entry, ties included; `jaxprune.structured`'s selectors
remove channels by it (in numpy, on the host), as they always have.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array, lax


def _last_axis(x: Array, axis: int | None) -> Array:
  """`x` with the ranked axis last: flattened to 1-D for `axis=None`."""
  return jnp.reshape(x, -1) if axis is None else jnp.moveaxis(x, axis, -1)


def _first_k(
  order: Array, k: Array | int, among: Array | None, shape: tuple[int, ...], axis: int | None
) -> Array:
  """True at the first `k` entries of `order` (along the last axis) that are in `among`."""
  if among is None:
    chosen_sorted = jnp.broadcast_to(jnp.arange(order.shape[-1]) < k, order.shape)
  else:
    candidates = jnp.take_along_axis(_last_axis(among, axis).astype(bool), order, axis=-1)
    place = jnp.cumsum(candidates, axis=-1, dtype=jnp.int32) - 1  # among the candidates
    chosen_sorted = candidates & (place < k)
  # Back from the order to the entries by each entry's rank, a second sort: a scatter
  # would be a while loop over the entries on XLA:CPU (and one more in the training
  # step, where the N:M masks are made).
  rank = jnp.argsort(order, axis=-1)
  chosen = jnp.take_along_axis(chosen_sorted, rank, axis=-1)
  return jnp.reshape(chosen, shape) if axis is None else jnp.moveaxis(chosen, -1, axis)


def lowest_k(
  scores: Array, k: Array | int, *, axis: int | None = None, among: Array | None = None
) -> Array:
  """True at the `k` lowest entries of `scores`; among equal scores the higher index first.

  The rule of this module: the last `k` of the descending order in which the lower
  index of a tie comes first (`lax.top_k`'s). Costs one sort of `scores`; for a small
  static `k`, `lowest_k_indices` needs none.

  Args:
    scores: real, any shape (NaN ranks highest).
    k: how many, an int or an int32 array (it may be traced); per slice along `axis`.
    axis: None ranks all entries together; an int ranks each slice along that axis.
    among: optional bool of the shape of `scores`: only these entries are candidates
      (the others are never selected), and `k` counts among them.

  Returns:
    A bool array of the shape of `scores`.
  """
  values = _last_axis(scores, axis)
  order = jnp.flip(jnp.argsort(values, axis=-1, descending=True, stable=True), axis=-1)
  return _first_k(order, k, among, scores.shape, axis)


def highest_k(scores: Array, k: Array | int, *, axis: int | None = None) -> Array:
  """True at the `k` highest entries of `scores`, in this module's order: the complement
  of `lowest_k(scores, n - k)` for `n` entries per slice. Each entry's rank is read from
  a second sort (the N:M masks keep the `n` highest of every `m` this way).

  Args:
    scores: real, any shape (NaN ranks highest).
    k: how many, an int or an int32 array; per slice along `axis`.
    axis: None ranks all entries together; an int ranks each slice along that axis.
  """
  values = _last_axis(scores, axis)
  rank = jnp.argsort(jnp.argsort(values, axis=-1, descending=True, stable=True), axis=-1)
  chosen = rank < k
  return jnp.reshape(chosen, scores.shape) if axis is None else jnp.moveaxis(chosen, -1, axis)


def lowest_k_stable(
  scores: Array, k: Array | int, *, axis: int | None = None, among: Array | None = None
) -> Array:
  """True at the `k` lowest entries of `scores`; among equal scores the LOWER index first.

  The second rule (see the module docstring): the first `k` of a stable ascending sort,
  as Wanda's reference code prunes. Arguments and result as in `lowest_k`.
  """
  values = _last_axis(scores, axis)
  order = jnp.argsort(values, axis=-1, stable=True)
  return _first_k(order, k, among, scores.shape, axis)


def highest_k_indices(scores: Array, k: int) -> Array:
  """Flat indices of the `k` highest entries of `scores`, highest first, in this module's
  order (among equal scores the lower index first), by `lax.top_k` on a static `k`."""
  return lax.top_k(jnp.reshape(scores, -1), k)[1]


def lowest_k_indices(scores: Array, k: int) -> Array:
  """Flat indices of the `k` lowest entries of `scores`, lowest first, in this module's
  order read from the bottom (among equal scores the higher index first).

  `lax.top_k` on a static `k`, with no sort of the whole array (SET's and RigL's drops
  are a few percent of a leaf): the scores are negated and reversed, so that top_k's
  lower-index-first ties land on the higher indices. Scores must not be NaN.
  """
  flat = jnp.reshape(scores, -1)
  _, reversed_at = lax.top_k(-flat[::-1], k)
  return flat.size - 1 - reversed_at
