"""Tests for jaxprune._masks.nm: the N:M mask rule and its validation."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pruning_helpers as helpers
import pytest

import jaxprune
from jaxprune._masks import nm as nm


def reference_nm(w, n, m, axis):
  """Loops over every group of m consecutive entries along `axis`; keeps the n largest |w|
  (ties: lower index first)."""
  w = np.asarray(w, np.float64)
  keep = np.zeros(w.shape, bool)
  others = [range(s) for d, s in enumerate(w.shape) if d != axis]
  for position in itertools.product(*others):
    for start in range(0, w.shape[axis], m):
      group = []
      for offset in range(m):
        index = list(position)
        index.insert(axis, start + offset)
        group.append(tuple(index))
      ranked = sorted(group, key=lambda ix: (-abs(w[ix]), ix[axis]))
      for ix in ranked[:n]:
        keep[ix] = True
  return keep


def test_dense_kernel_2_of_4_by_hand():
  # (in=4, out=2): groups run down each column (the input-channel axis).
  w = jnp.array([[0.1, -5.0], [-0.4, 1.0], [0.3, 2.0], [0.2, -3.0]])
  np.testing.assert_array_equal(nm.nm_mask(w, 2, 4), [[0, 1], [1, 0], [1, 0], [0, 1]])


def test_ties_keep_the_lower_index_and_nan_is_kept():
  np.testing.assert_array_equal(nm.nm_mask(jnp.ones((4, 1)), 2, 4)[:, 0], [1, 1, 0, 0])
  w = jnp.array([[1.0], [jnp.nan], [3.0], [2.0]])
  np.testing.assert_array_equal(nm.nm_mask(w, 2, 4)[:, 0], [0, 1, 1, 0])


@pytest.mark.parametrize(
  'shape, n, m, axis',
  [
    ((8, 6), 2, 4, -2),  # Dense (in, out)
    ((8, 6), 1, 2, 0),
    ((3, 3, 8, 5), 2, 4, -2),  # conv HWIO: the input-channel axis
    ((2, 12, 3), 1, 3, 1),
    ((12,), 3, 4, 0),
    ((4, 6), 2, 3, -1),
  ],
)
def test_matches_reference(shape, n, m, axis):
  rng = np.random.default_rng(sum(shape) + n + m)
  # Rounded values give ties, which the reference breaks by index.
  w = np.round(rng.normal(size=shape), 1).astype(np.float32)
  got = nm.nm_mask(jnp.asarray(w), n, m, axis)
  expected = reference_nm(w, n, m, axis % len(shape))
  np.testing.assert_array_equal(got, expected)
  assert int(got.sum()) == w.size * n // m
  assert bool(nm.is_nm_sparse(got, n, m, axis))
  assert bool(nm.is_nm_sparse(jnp.where(got, w, 0.0), n, m, axis))


@pytest.mark.slow
@pytest.mark.parametrize('n, m', [(2, 4), (1, 8), (5, 16), (31, 32), (3, 64)])
def test_comparison_ranks_as_the_sort(n, m):
  # nm_mask ranks groups of up to 32 by pairwise comparison, larger ones by sorting
  # the scores: the same masks, with ties, zeros, infinities and NaN (ranked as inf).
  rng = np.random.default_rng(m)
  w = np.round(rng.normal(size=(2 * m, 3)), 1).astype(np.float32)
  w[::5, 0], w[1::7, 1], w[2::9, 2] = 0.0, np.inf, np.nan
  magnitudes = np.where(np.isnan(w), np.inf, np.abs(w))
  expected = nm.nm_mask_from_scores(jnp.asarray(magnitudes), n, m)
  np.testing.assert_array_equal(nm.nm_mask(jnp.asarray(w), n, m), expected)
  np.testing.assert_array_equal(nm.nm_mask(jnp.asarray(w), n, m), reference_nm(magnitudes, n, m, 0))


def test_jit_and_bfloat16():
  rng = np.random.default_rng(0)
  w = rng.normal(size=(16, 8)).astype(np.float32)
  jitted = jax.jit(nm.nm_mask, static_argnums=(1, 2, 3))
  expected = reference_nm(w, 2, 4, 0)
  np.testing.assert_array_equal(jitted(jnp.asarray(w), 2, 4, -2), expected)
  w16 = jnp.asarray(w, jnp.bfloat16)
  np.testing.assert_array_equal(nm.nm_mask(w16, 2, 4), reference_nm(np.asarray(w16), 2, 4, 0))


def test_is_nm_sparse_detects_a_violation():
  x = jnp.array([[1.0], [1.0], [1.0], [0.0]])
  assert not bool(nm.is_nm_sparse(x, 2, 4))
  assert bool(nm.is_nm_sparse(x, 3, 4))


def test_nm_mask_from_scores_ranks_by_the_scores():
  scores = jnp.array([[3.0], [-1.0], [0.0], [2.0]])
  np.testing.assert_array_equal(nm.nm_mask_from_scores(scores, 2, 4)[:, 0], [1, 0, 0, 1])


def test_not_divisible_is_a_clear_error():
  with pytest.raises(
    ValueError,
    match=r"leaf 'Dense_0/kernel' with shape \(6, 3\): axis 0 has "
    r'6 entries, which is not divisible by M=4',
  ):
    nm.nm_mask(jnp.ones((6, 3)), 2, 4, name='Dense_0/kernel')
  with pytest.raises(ValueError, match='axis=2 is out of range'):
    nm.nm_mask(jnp.ones((4, 4)), 2, 4, axis=2)
  with pytest.raises(ValueError, match='scalar'):
    nm.nm_mask(jnp.float32(1.0), 2, 4)


@pytest.mark.parametrize(
  'text, expected',
  [
    ('2:4', (2, 4)),
    (' 1 : 8 ', (1, 8)),
    ((2, 4), (2, 4)),
    ('', None),
    (None, None),
  ],
)
def test_parse_nm(text, expected):
  assert nm.parse_nm(text) == expected


@pytest.mark.parametrize(
  'text, match',
  [
    ('2-4', 'two integers'),
    ('2:4:8', 'two integers'),
    ('a:4', 'two integers'),
    ('4:4', '1 <= N < M'),
    ('0:4', '1 <= N < M'),
    ('5:4', '1 <= N < M'),
    ((2.0, 4), 'integers'),
    ((2,), 'pair'),
  ],
)
def test_parse_nm_rejects(text, match):
  with pytest.raises(ValueError, match=match):
    nm.parse_nm(text)


def test_nm_leaf_with_nan_is_counted_and_keeps_its_mask():
  w = np.arange(1, 33, dtype=np.float32).reshape(8, 4)
  params = {'d': {'kernel': jnp.asarray(w)}}
  tx = jaxprune.pruning(helpers.hparams(nm_sparsity='2:4', pruning_frequency=1))
  state = helpers.run_updates(tx, params, 2)
  before = np.asarray(state.masks['d']['kernel'])
  w[0, 0] = np.nan
  params = {'d': {'kernel': jnp.asarray(w)}}
  zeros = jax.tree.map(jnp.zeros_like, params)
  _, state = jax.jit(tx.update)(zeros, state, params)
  assert int(state.nonfinite_skips) == 1
  np.testing.assert_array_equal(state.masks['d']['kernel'], before)
