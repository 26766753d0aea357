"""Every reference number of the semantics page: the numbers TF itself printed.

See docs/explanation/semantics.md#reference-numbers.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxprune
from jaxprune._search import thresholds as thresholds

LINSPACE = np.linspace(1, 100, 100).astype(np.float32)


def test_default_schedule():
  hp = jaxprune.get_pruning_hparams()
  expected = [
    (0, 0.0),
    (10, 0.1355),
    (25, 0.289062),
    (50, 0.4375),
    (75, 0.492188),
    (90, 0.4995),
    (100, 0.5),
    (110, 0.5),
  ]
  for step, sparsity in expected:
    assert float(jaxprune.sparsity_at(hp, step)) == pytest.approx(sparsity, abs=1e-6), step


@pytest.mark.parametrize(
  'sparsity, threshold, nonzero',
  [(0.5, 50.0, 50), (0.95, 94.921875, 6), (0.9, 89.84375, 11), (0.33, 32.8125, 68)],
)
def test_histogram_threshold_on_linspace(sparsity, threshold, nonzero):
  new_threshold, mask = jaxprune.update_mask(LINSPACE, 0.0, sparsity, nbins=256)
  assert float(new_threshold) == threshold
  assert int(mask.sum()) == nonzero
  assert mask.dtype == jnp.bool_ and mask.shape == LINSPACE.shape


@pytest.mark.slow
@pytest.mark.parametrize('sparsity, nonzero', [(0.5, 50), (0.95, 5), (0.9, 10), (0.33, 67)])
def test_exact_threshold_on_linspace(sparsity, nonzero):
  _, mask = jaxprune.update_mask(LINSPACE, 0.0, sparsity, threshold_method='exact')
  assert int(mask.sum()) == nonzero
  # The kept entries are the largest ones.
  np.testing.assert_array_equal(np.asarray(mask), np.arange(100) >= 100 - nonzero)


@pytest.mark.slow
def test_histogram_cdf_values_above_range_land_in_last_bin():
  values = np.array([-1, 0, 1, 1.5, 2, 3, 4, 5, 10, 100], np.float32)
  cdf = thresholds.histogram_cdf(values, 5.0, 5)
  np.testing.assert_array_equal(np.asarray(cdf), np.float32([0.1, 0.4, 0.5, 0.6, 1.0]))


def test_update_gating_with_external_sparsity():
  hp = jaxprune.parse_hparams(
    'pruning_frequency=2,begin_pruning_step=1,end_pruning_step=6,nbins=100'
  )
  schedule = jnp.asarray(np.linspace(0, 0.9, 10), jnp.float32)
  tx = jaxprune.pruning(
    hp, sparsity_fn=lambda step: schedule[step], prune_filter=lambda name, leaf: True
  )
  params = {'w': jnp.asarray(LINSPACE)}
  state = tx.init(params)
  update = jax.jit(tx.update)
  nonzero, last_update = [], []
  for _ in range(10):
    updates, state = update({'w': jnp.zeros(100)}, state, params)
    nonzero.append(int(jnp.count_nonzero(optax.apply_updates(params, updates)['w'])))
    last_update.append(int(state.last_update_step))
  assert nonzero == [100, 100, 80, 80, 60, 60, 40, 40, 40, 40]
  assert last_update == [0, 0, 2, 2, 4, 4, 6, 6, 6, 6]


def test_threshold_decay():
  expected = [(5.0, 95), (9.5, 91), (13.55, 87), (17.195, 83), (20.4755, 80)]
  threshold = jnp.float32(0.0)
  for want_threshold, want_nonzero in expected:
    threshold, mask = jaxprune.update_mask(LINSPACE, threshold, 0.5, threshold_decay=0.9)
    assert float(threshold) == pytest.approx(want_threshold, rel=1e-6)
    assert int(mask.sum()) == want_nonzero


BLOCK_ROWS = [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]


@pytest.mark.parametrize(
  'pooling, weights',
  [
    ('MAX', [[0.1, 0, 0.2, 0], [0, -0.1, 0, -0.2], [0.3, 0, 0.4, 0], [0, -0.3, 0, -0.4]]),
    (
      'AVG',
      [[0.1, 0.1, 0.2, 0.2], [0.1, 0.1, 0.2, 0.2], [0.3, 0.3, 0.4, 0.4], [0.3, 0.3, 0.4, 0.4]],
    ),
  ],
)
@pytest.mark.parametrize('leading_one', [False, True])
def test_block_masks(pooling, weights, leading_one):
  weights = np.asarray(weights, np.float32)
  if leading_one:
    weights = weights[None]
  _, mask = jaxprune.update_mask(
    weights, 0.0, 0.5, block_dims=(2, 2), block_pooling_function=pooling
  )
  assert mask.shape == weights.shape
  np.testing.assert_array_equal(np.asarray(mask).reshape(4, 4), BLOCK_ROWS)


def _train_three_layers(map_text, method):
  hp = jaxprune.parse_hparams(
    f'target_sparsity=0.5,pruning_frequency=1,threshold_method={method},'
    f'weight_sparsity_map=[{map_text}]'
  )
  params = {
    'layer1': {'weights': LINSPACE},
    'layer2': {'weights': LINSPACE},
    'layer3': {'kernel': LINSPACE},
  }
  tx = jaxprune.pruning(hp, prune_filter=lambda name, leaf: True)
  state = tx.init(params)
  update = jax.jit(tx.update)
  zeros = jax.tree.map(jnp.zeros_like, params)
  for _ in range(110):
    _, state = update(zeros, state, params)
  return jaxprune.get_weight_sparsity(state)


# The dense params are fed at every step (the weights TF's reference masks in its graph),
# so pruned weights are never zeroed and the moved-weights check warns, as it should.
@pytest.mark.filterwarnings('ignore:jaxprune.*no longer zero:UserWarning')
@pytest.mark.parametrize(
  'method, expected', [('histogram', [0.59, 0.75, 0.59]), ('exact', [0.6, 0.75, 0.6])]
)
def test_weight_specific_targets(method, expected):
  sparsity = _train_three_layers('layer1:0.6,layer2/weights:0.75,.*kernel:0.6', method)
  got = [float(sparsity[k]) for k in ('layer1/weights', 'layer2/weights', 'layer3/kernel')]
  np.testing.assert_allclose(got, expected, atol=1e-6)


def test_per_layer_block_dims():
  hp = jaxprune.parse_hparams(
    'target_sparsity=0.5,block_dims_map=[layer1/weights:1x1,layer2/weights:1x2]'
  )
  params = {
    'layer1': {'weights': jnp.float32([[-0.1, 0.1], [-0.2, 0.2]])},
    'layer2': {'weights': jnp.float32([[0.1, 0.1, 0.3, 0.3], [0.2, 0.2, 0.4, 0.4]])},
  }
  specs = jaxprune._config.specs.leaf_specs(params, hp, lambda name, leaf: True)
  masks = {}
  for layer, spec in specs.items():
    _, mask = jaxprune.update_mask(
      params[layer]['weights'], 0.0, 0.5, block_dims=spec['weights'].block_dims
    )
    masks[layer] = np.asarray(mask).astype(int).tolist()
  assert masks['layer1'] == [[0, 0], [1, 1]]
  assert masks['layer2'] == [[0, 0, 1, 1], [0, 0, 1, 1]]
