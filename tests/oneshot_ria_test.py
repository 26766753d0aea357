"""RIA (`oneshot.prune(method='ria')`, Zhang et al., ICLR 2024) against its score written
here in numpy, as its code (`prune_ria`) computes it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from oneshot_references import conv_patches, row_mask, stable_prune

from jaxprune import oneshot


def ria_scores(w, x, col_groups=1):
  """(|W| / row sums + |W| / column sums) * ||X_j||^0.5, w as (outputs, inputs); the column
  sums over each of `col_groups` equal blocks of rows."""
  a = np.abs(w.astype(np.float64))
  rows = a.sum(1, keepdims=True)
  cols = np.concatenate(
    [np.repeat(b.sum(0, keepdims=True), len(b), 0) for b in np.split(a, col_groups)]
  )
  return (a / rows + a / cols) * np.sqrt(np.sqrt((x**2).sum(-2)))


def _setup(k=16, out=8, n=64, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, k)) * np.exp(rng.normal(size=k))
  w = (rng.normal(size=(k, out)) * np.exp(rng.normal(size=out))).astype(np.float32)
  batches = [jnp.asarray(x[: n // 2], jnp.float32), jnp.asarray(x[n // 2 :], jnp.float32)]
  return x, w, batches


def _linear(params, x):
  return x @ params['w']


def test_ria_prunes_the_lowest_scores_of_the_layer_or_of_each_row():
  x, w, batches = _setup()
  scores = ria_scores(w.T, x)
  layer = ~stable_prune(scores.ravel(), round(0.6 * scores.size)).reshape(scores.shape)
  _, masks = oneshot.prune(_linear, {'w': jnp.asarray(w)}, batches, method='ria', sparsity=0.6)
  np.testing.assert_array_equal(np.asarray(masks['w']), layer.T)
  _, masks = oneshot.prune(
    _linear, {'w': jnp.asarray(w)}, batches, method='ria', sparsity=0.6, per_row=True
  )
  np.testing.assert_array_equal(np.asarray(masks['w']), row_mask(scores, 0.6, None).T)
  # RIA is not Wanda: the relative terms change what is kept.
  wanda = row_mask(np.abs(w.T) * np.sqrt((x**2).sum(0)), 0.6, None)
  assert (row_mask(scores, 0.6, None) != wanda).any()


@pytest.mark.parametrize('nm', [(2, 4), (4, 8)])
def test_ria_nm(nm):
  x, w, batches = _setup()
  expected = row_mask(ria_scores(w.T, x), None, nm)
  pruned, masks = oneshot.prune(
    _linear, {'w': jnp.asarray(w)}, batches, method='ria', nm=f'{nm[0]}:{nm[1]}'
  )
  np.testing.assert_array_equal(np.asarray(masks['w']), expected.T)
  np.testing.assert_array_equal(np.asarray(pruned['w']), np.where(expected.T, w, 0))


def test_ria_on_a_grouped_convolution_sums_columns_within_a_group():
  rng = np.random.default_rng(5)
  x = rng.normal(size=(2, 6, 6, 4)) * np.exp(rng.normal(size=4))
  kernel = rng.normal(size=(3, 3, 2, 6)).astype(np.float32)  # HWIO, 2 groups of 2 inputs

  def conv(params, x):
    return jax.lax.conv_general_dilated(
      x,
      params['k'],
      (1, 1),
      'VALID',
      dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
      feature_group_count=2,
    )

  patches = conv_patches(x, (3, 3), 1, ((0, 0), (0, 0)), 1, 2)  # (groups, tokens, 18)
  w = np.transpose(kernel, (3, 0, 1, 2)).reshape(6, 18)  # (outputs, (a, b, c))
  norms = np.repeat(np.sqrt(np.sqrt((patches**2).sum(1))), 3, axis=0)  # (6, 18)
  a = np.abs(w.astype(np.float64))
  cols = np.concatenate(
    [np.repeat(a[:3].sum(0, keepdims=True), 3, 0), np.repeat(a[3:].sum(0, keepdims=True), 3, 0)]
  )
  scores = (a / a.sum(1, keepdims=True) + a / cols) * norms
  expected = ~stable_prune(scores.ravel(), round(0.5 * scores.size)).reshape(6, 3, 3, 2)
  _, masks = oneshot.prune(
    conv, {'k': jnp.asarray(kernel)}, [jnp.asarray(x, jnp.float32)], method='ria', sparsity=0.5
  )
  np.testing.assert_array_equal(np.asarray(masks['k']), np.transpose(expected, (1, 2, 3, 0)))
