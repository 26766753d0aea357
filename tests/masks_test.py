"""Masks through the public transform: weights that cannot be thresholded.

See docs/explanation/semantics.md#weights-that-cannot-be-thresholded.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxprune

F32 = np.float32
# Per leaf, the value one weight takes at the third step; 'n' has an N:M mask.
BAD = {'a': np.inf, 'b': -np.inf, 'c': np.nan, 'n': np.inf}


@pytest.mark.parametrize(
  'rule', ['threshold_method=histogram', 'threshold_method=exact', 'global_pruning=true']
)
def test_non_finite_weights_are_counted_and_keep_their_masks(rule):
  """An infinite weight is as unusable as a NaN: counted in nonfinite_skips, mask kept.

  Checking NaN alone (isnan for ~isfinite) would let +-inf through uncounted.
  """
  tx = jaxprune.pruning(
    f'{rule},nm_sparsity_map=[n/kernel:2:4],pruning_frequency=1,sparsity_function_end_step=1'
  )
  weights = {name: np.arange(1, 33, dtype=F32).reshape(8, 4) for name in BAD}
  params = lambda: {name: {'kernel': jnp.asarray(w)} for name, w in weights.items()}
  state = tx.init(params())
  update = jax.jit(tx.update)

  def step(state):
    return update(jax.tree.map(jnp.zeros_like, params()), state, params())[1]

  state = step(step(state))  # step 1 updates the masks from finite weights
  before = {name: np.asarray(state.masks[name]['kernel']) for name in BAD}
  assert all(0 < m.sum() < m.size for m in before.values())
  for name, bad in BAD.items():
    weights[name][3, 1] = bad
  after = step(state)  # step 2 would update them again
  assert int(after.last_update_step) == 2
  assert int(after.nonfinite_skips) == len(BAD)
  for name in BAD:
    np.testing.assert_array_equal(after.masks[name]['kernel'], before[name])


@pytest.mark.parametrize(
  'kwargs, message',
  [
    (dict(block_pooling_function='MIN'), 'block_pooling_function'),
    (dict(threshold_method='sort'), 'threshold_method'),
    (dict(nbins=1), 'nbins'),
    (dict(threshold_decay=1.0), 'threshold_decay'),
    (dict(block_dims=(0, 2)), 'block_dims'),
  ],
)
def test_update_mask_checks_its_arguments(kwargs, message):
  with pytest.raises(ValueError, match=message):
    jaxprune.update_mask(jnp.ones((4, 4)), 0.0, 0.5, **kwargs)


@pytest.mark.parametrize('sparsity', [1.5, -0.2, 1.0, float('nan')])
def test_update_mask_checks_a_concrete_sparsity(sparsity):
  with pytest.raises(ValueError, match='sparsity'):
    jaxprune.update_mask(jnp.ones((4, 4)), 0.0, sparsity)


@pytest.mark.parametrize('block_dims', [(1, 1), (2, 2)])
def test_update_mask_of_an_empty_leaf_keeps_threshold_and_mask(block_dims):
  threshold, mask = jaxprune.update_mask(
    jnp.zeros((0, 4)), 0.25, 0.5, block_dims=block_dims, previous_mask=jnp.ones((0, 4), bool)
  )
  assert float(threshold) == 0.25 and mask.shape == (0, 4) and mask.dtype == bool
