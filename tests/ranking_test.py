"""The one tie rule (`jaxprune._masks.ranking`) against plainly written numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxprune._masks import ranking as ranking


def _lowest_reference(scores, k, among=None, lower_first=False):
  """The k lowest of a 1-d array among the candidates: ascending score, then among equal
  scores the higher index first (the library's rule) or the lower (`lower_first`)."""
  index = np.arange(scores.size)
  candidates = index if among is None else index[among]
  tie = candidates if lower_first else -candidates
  chosen = np.zeros(scores.size, bool)
  chosen[candidates[np.lexsort((tie, scores[candidates]))][:k]] = True
  return chosen


def test_ties_by_hand():
  scores = jnp.array([1.0, 3.0, 3.0, 2.0, 3.0])
  # The two lowest of [1, 3, 3, 2, 3]: 1, then 2.
  np.testing.assert_array_equal(ranking.lowest_k(scores, 2), [1, 0, 0, 1, 0])
  # Three of the 3s tie for the 3rd and 4th lowest: the higher indices go first.
  np.testing.assert_array_equal(ranking.lowest_k(scores, 4), [1, 0, 1, 1, 1])
  np.testing.assert_array_equal(ranking.lowest_k_stable(scores, 4), [1, 1, 1, 1, 0])
  np.testing.assert_array_equal(ranking.lowest_k_indices(scores, 4), [0, 3, 4, 2])
  np.testing.assert_array_equal(ranking.highest_k_indices(scores, 2), [1, 2])


@pytest.mark.parametrize('seed', range(4))
def test_rules_against_numpy_with_many_ties(seed):
  rng = np.random.default_rng(seed)
  scores = rng.integers(0, 4, 60).astype(np.float32)
  among = rng.random(60) < 0.6
  lowest = jax.jit(ranking.lowest_k, static_argnames='axis')
  for k in (0, 1, 7, 23, 60):
    want = _lowest_reference(scores, k)
    np.testing.assert_array_equal(lowest(jnp.asarray(scores), k), want)
    np.testing.assert_array_equal(lowest(jnp.asarray(scores), jnp.int32(k)), want)  # traced k
    np.testing.assert_array_equal(
      ranking.lowest_k_stable(jnp.asarray(scores), k), _lowest_reference(scores, k, None, True)
    )
    got_among = lowest(jnp.asarray(scores), min(k, among.sum()), among=jnp.asarray(among))
    np.testing.assert_array_equal(got_among, _lowest_reference(scores, min(k, among.sum()), among))
    if k:
      indices = np.asarray(ranking.lowest_k_indices(jnp.asarray(scores), k))
      np.testing.assert_array_equal(np.sort(indices), np.flatnonzero(want))
      order = np.lexsort((-np.arange(60), scores))  # ascending, then the higher index
      np.testing.assert_array_equal(indices, order[:k])
      highest = np.asarray(ranking.highest_k_indices(jnp.asarray(scores), k))
      np.testing.assert_array_equal(highest, np.lexsort((np.arange(60), -scores))[:k])


def test_along_an_axis_each_slice_is_ranked_alone():
  rng = np.random.default_rng(5)
  scores = rng.integers(0, 3, (4, 6, 5)).astype(np.float32)
  got = np.asarray(ranking.lowest_k(jnp.asarray(scores), 2, axis=1))
  got_stable = np.asarray(ranking.lowest_k_stable(jnp.asarray(scores), 2, axis=1))
  for i in range(4):
    for j in range(5):
      np.testing.assert_array_equal(got[i, :, j], _lowest_reference(scores[i, :, j], 2))
      np.testing.assert_array_equal(
        got_stable[i, :, j], _lowest_reference(scores[i, :, j], 2, None, True)
      )


def test_nan_ranks_highest_and_signed_zeros_tie():
  scores = jnp.array([np.nan, 0.0, -0.0, np.inf, -1.0])
  # -1 lowest; then the zeros, which tie (the higher index first); NaN last.
  np.testing.assert_array_equal(ranking.lowest_k(scores, 2), [0, 0, 1, 0, 1])
  np.testing.assert_array_equal(ranking.lowest_k(scores, 4), [0, 1, 1, 1, 1])


def test_highest_k_is_the_complement_of_lowest_k():
  rng = np.random.default_rng(3)
  scores = jnp.asarray(rng.integers(0, 4, (6, 8)).astype(np.float32))  # many ties
  for k in range(9):
    np.testing.assert_array_equal(
      ranking.highest_k(scores, k, axis=1), ~ranking.lowest_k(scores, 8 - k, axis=1)
    )
  flat = scores.reshape(-1)
  np.testing.assert_array_equal(ranking.highest_k(flat, 5), ~ranking.lowest_k(flat, 43))
