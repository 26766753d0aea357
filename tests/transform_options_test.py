"""The transform's options, maps, errors and accessors vs numpy references.

See docs/explanation/semantics.md#blocks, #names-and-maps, #applying-the-masks and #reports.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import references

import jaxprune
from jaxprune._config import hparams as hparams_lib

F32 = np.float32


def _hparams(**overrides):
  hparams = jaxprune.get_pruning_hparams()
  hparams.update(overrides)
  return hparams


def _dyadic(shape, seed):
  """Distinct integers times 2**-4: exact block sums, no ties."""
  rng = np.random.default_rng(seed)
  size = int(np.prod(shape))
  return (rng.permutation(size) + 1.0) * rng.choice([-1.0, 1.0], size) / 16.0


def _one_update(tx, params):
  """Runs init and two zero updates; with frequency 1 the second one updates the masks."""
  state = tx.init(params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  update = jax.jit(tx.update)
  for _ in range(2):
    _, state = update(zeros, state, params)
  return state


# Frequency 1, schedule over one step: the update at step 1 uses the target itself.
ONE_SHOT = dict(pruning_frequency=1, sparsity_function_end_step=1)


def test_accessors_on_state_and_chain_state():
  hparams = _hparams(name='prune', target_sparsity=0.5, **ONE_SHOT)
  params = {
    'Dense_0': {
      'kernel': jnp.asarray(np.linspace(1, 100, 100).reshape(10, 10), jnp.float32),
      'bias': jnp.arange(10, dtype=jnp.float32),
    }
  }
  tx = optax.chain(optax.sgd(0.0), jaxprune.pruning(hparams))
  opt_state = _one_update(tx, params)
  state = opt_state[1]
  assert jaxprune.find_pruning_state(opt_state) is state
  assert jaxprune.find_pruning_state(state) is state
  # docs/explanation/semantics.md#reference-numbers: linspace(1, 100, 100) at s = 0.5 has threshold
  # 50 and keeps 51..100.
  expected_mask = np.linspace(1, 100, 100).reshape(10, 10) > 50
  for source in (state, opt_state):
    masks = jaxprune.get_masks(source)
    assert masks['Dense_0']['bias'] is None
    np.testing.assert_array_equal(masks['Dense_0']['kernel'], expected_mask)
    assert jaxprune.get_thresholds(source) == {'Dense_0/kernel': 50.0}
    assert jaxprune.get_weight_sparsity(source) == {'Dense_0/kernel': 0.5}
    summary = jaxprune.summaries(source, hparams)
    assert {k: float(v) for k, v in summary.items()} == {
      'prune/sparsity': 0.5,
      'prune/last_mask_update_step': 1.0,
      'prune/nonfinite_skips': 0.0,
      'prune/moved_updates': 0.0,
      'Dense_0/kernel/sparsity': 0.5,
      'Dense_0/kernel/threshold': 50.0,
    }
    assert 'model_pruning/sparsity' in jaxprune.summaries(source)
    masked = jaxprune.apply_masks(params, source)
    np.testing.assert_array_equal(
      masked['Dense_0']['kernel'], np.where(expected_mask, params['Dense_0']['kernel'], 0.0)
    )
    np.testing.assert_array_equal(masked['Dense_0']['bias'], params['Dense_0']['bias'])
  assert jaxprune.get_weight_sparsity(masked) == {'Dense_0/kernel': 0.5}


def test_find_pruning_state_needs_exactly_one():
  params = {'kernel': jnp.ones((4, 4))}
  hparams = _hparams()
  two = optax.chain(jaxprune.pruning(hparams), jaxprune.pruning(hparams)).init(params)
  with pytest.raises(ValueError, match='found 2'):
    jaxprune.find_pruning_state(two)
  with pytest.raises(ValueError, match='found 0'):
    jaxprune.get_masks(optax.adam(1e-3).init(params))


def test_update_without_params_raises():
  tx = jaxprune.pruning(_hparams())
  params = {'kernel': jnp.ones((4, 4))}
  with pytest.raises(ValueError, match='params'):
    tx.update(params, tx.init(params))


def test_prune_filter_replaces_regex():
  params = {
    'conv': {'w': jnp.asarray(_dyadic((6, 10), 0), jnp.float32)},
    'Dense_0': {'kernel': jnp.asarray(_dyadic((6, 10), 1), jnp.float32)},
  }
  tx = jaxprune.pruning(
    _hparams(threshold_method='exact', **ONE_SHOT),
    prune_filter=lambda name, leaf: name.endswith('/w'),
  )
  state = _one_update(tx, params)
  assert state.masks['Dense_0']['kernel'] is None
  magnitudes = np.abs(np.asarray(params['conv']['w']))
  np.testing.assert_array_equal(
    state.masks['conv']['w'], magnitudes >= np.sort(magnitudes.ravel())[::-1][30 - 1]
  )


def test_default_filter_skips_vectors_and_other_names():
  params = {
    'a': {'kernel': jnp.ones((5,))},
    'b': {'embedding': jnp.ones((3, 4))},
    'c': {'scale': jnp.ones((3, 4))},
  }
  state = jaxprune.pruning(_hparams()).init(params)
  assert state.masks['a']['kernel'] is None and state.masks['c']['scale'] is None
  assert state.masks['b']['embedding'].shape == (3, 4)
  assert state.masks['b']['embedding'].dtype == jnp.bool_


def test_two_matching_map_entries_raise():
  hparams = _hparams(weight_sparsity_map=['Dense:0.6', 'kernel:0.7'])
  with pytest.raises(ValueError, match='Dense_0/kernel'):
    jaxprune.pruning(hparams).init({'Dense_0': {'kernel': jnp.ones((4, 4))}})


def test_unused_map_entry_warns_at_init_only():
  hparams = _hparams(weight_sparsity_map=['Dense_0:0.6', 'no_such_layer:0.7'])
  tx = jaxprune.pruning(hparams)
  params = {'Dense_0': {'kernel': jnp.ones((4, 4))}}
  with pytest.warns(UserWarning, match='no_such_layer'):
    state = tx.init(params)
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    jax.jit(tx.update)(params, state, params)


def test_minus_one_block_dims_resolved_per_variable():
  # '-1' is each kernel's own height: whole columns are pruned in both (TF gave the
  # second kernel the first one's height, 4, splitting its columns in halves).
  params = {
    'a': {'kernel': jnp.asarray(_dyadic((4, 6), 0).reshape(4, 6), jnp.float32)},
    'b': {'kernel': jnp.asarray(_dyadic((8, 3), 1).reshape(8, 3), jnp.float32)},
  }
  hparams = _hparams(
    block_dims_map=['kernel:-1x1'],
    threshold_method='exact',
    block_pooling_function='MAX',
    **ONE_SHOT,
  )
  state = _one_update(jaxprune.pruning(hparams), params)
  for name, width in (('a', 6), ('b', 3)):
    weights = np.asarray(params[name]['kernel'])
    _, expected = references.block_mask(weights, F32(0.5), (-1, 1), 'MAX', 256, 'exact')
    mask = np.asarray(state.masks[name]['kernel'])
    np.testing.assert_array_equal(mask, expected)
    assert (mask.all(axis=0) | ~mask.any(axis=0)).all()
    assert mask.all(axis=0).sum() == max(round(width * 0.5), 1)


@pytest.mark.parametrize('method', ['histogram', 'exact'])
def test_global_pruning_one_threshold_over_all_leaves(method):
  rng = np.random.default_rng(5)
  params = {
    'Dense_0': {'kernel': jnp.asarray(rng.standard_normal((8, 12)), jnp.float32)},
    'Dense_1': {'kernel': jnp.asarray(3 * rng.standard_normal((12, 4)), jnp.float32)},
  }
  hparams = _hparams(global_pruning=True, target_sparsity=0.7, threshold_method=method, **ONE_SHOT)
  state = _one_update(jaxprune.pruning(hparams), params)
  magnitudes = [np.abs(np.asarray(params[k]['kernel'])) for k in ('Dense_0', 'Dense_1')]
  threshold, _ = references.threshold_and_mask(
    np.concatenate([m.ravel() for m in magnitudes]), F32(0.7), 256, method
  )
  thresholds = jaxprune.get_thresholds(state)
  for layer, magnitude in zip(('Dense_0', 'Dense_1'), magnitudes, strict=True):
    assert thresholds[f'{layer}/kernel'] == threshold
    expected = magnitude >= threshold if method == 'exact' else magnitude > threshold
    np.testing.assert_array_equal(state.masks[layer]['kernel'], expected)


def test_nm_sparsity_global_and_per_regex():
  rng = np.random.default_rng(6)
  params = {
    'Dense_0': {'kernel': jnp.asarray(rng.standard_normal((8, 6)), jnp.float32)},
    'Dense_1': {'kernel': jnp.asarray(rng.standard_normal((12, 4)), jnp.float32)},
  }
  state = _one_update(jaxprune.pruning(_hparams(nm_sparsity='2:4', **ONE_SHOT)), params)
  for layer in ('Dense_0', 'Dense_1'):
    np.testing.assert_array_equal(
      state.masks[layer]['kernel'], references.nm_mask(np.asarray(params[layer]['kernel']), 2, 4)
    )
  hparams = _hparams(
    nm_sparsity_map=['Dense_0:1:4'], threshold_method='exact', target_sparsity=0.25, **ONE_SHOT
  )
  state = _one_update(jaxprune.pruning(hparams), params)
  np.testing.assert_array_equal(
    state.masks['Dense_0']['kernel'],
    references.nm_mask(np.asarray(params['Dense_0']['kernel']), 1, 4),
  )
  magnitudes = np.abs(np.asarray(params['Dense_1']['kernel']))
  np.testing.assert_array_equal(
    state.masks['Dense_1']['kernel'], magnitudes >= np.sort(magnitudes.ravel())[::-1][36 - 1]
  )


def test_nm_input_axis_not_divisible_raises():
  tx = jaxprune.pruning(_hparams(nm_sparsity='2:4', **ONE_SHOT))
  params = {'Dense_0': {'kernel': jnp.ones((6, 8))}}
  with pytest.raises(ValueError, match='not divisible by M=4'):
    _one_update(tx, params)


# The dense params are fed at every step (the weights TF's reference masks in its graph),
# so pruned weights are never zeroed and the moved-weights check warns, as it should.
@pytest.mark.filterwarnings('ignore:jaxprune.*no longer zero:UserWarning')
def test_nonfinite_and_zero_leaves_keep_masks_and_count_skips():
  hparams = _hparams(
    threshold_method='exact', pruning_frequency=1, sparsity_function_end_step=4, target_sparsity=0.5
  )
  rng = np.random.default_rng(7)
  finite = rng.standard_normal((6, 10)).astype(F32)
  broken = rng.standard_normal((6, 10)).astype(F32)
  params = {
    'bad': {'kernel': jnp.asarray(broken)},
    'good': {'kernel': jnp.asarray(finite)},
    'zero': {'kernel': jnp.zeros((6, 10))},
  }
  tx = jaxprune.pruning(hparams)
  update = jax.jit(tx.update)
  state = tx.init(params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  for _ in range(3):  # updates at steps 1 and 2 on finite weights
    _, state = update(zeros, state, params)
  kept_mask = np.asarray(state.masks['bad']['kernel'])
  kept_threshold = np.asarray(state.thresholds['bad']['kernel'])
  assert not kept_mask.all() and int(state.nonfinite_skips) == 0
  broken[1, 2], broken[4, 4] = np.nan, np.inf
  params['bad']['kernel'] = jnp.asarray(broken)
  for step in (3, 4):
    _, state = update(zeros, state, params)
    assert int(state.nonfinite_skips) == step - 2
    np.testing.assert_array_equal(state.masks['bad']['kernel'], kept_mask)
    assert state.thresholds['bad']['kernel'] == kept_threshold
    assert state.thresholds['zero']['kernel'] == 0.0
    assert np.asarray(state.masks['zero']['kernel']).all()
  # The finite leaf still followed the schedule to its target.
  magnitudes = np.abs(finite)
  np.testing.assert_array_equal(
    state.masks['good']['kernel'], magnitudes >= np.sort(magnitudes.ravel())[::-1][30 - 1]
  )
  assert int(jaxprune.summaries(state)['model_pruning/nonfinite_skips']) == 2


def test_nm_error_names_the_leaf():
  tx = jaxprune.pruning(_hparams(nm_sparsity='2:4', **ONE_SHOT))
  with pytest.raises(ValueError, match='Dense_0/kernel'):
    _one_update(tx, {'Dense_0': {'kernel': jnp.ones((6, 8))}})


def test_params_sparsity_counts_nan_separately():
  params = {'k': {'kernel': jnp.asarray([[0.0, np.nan], [1.0, 0.0]])}, 'bias': jnp.zeros(3)}
  assert jaxprune.get_weight_sparsity(params) == {'k/kernel': 0.5}
  assert jaxprune.count_nonfinite(params) == {'k/kernel': 1}


@pytest.mark.slow
def test_hparams_by_keyword_equal_the_config():
  """`pruning(target_sparsity=...)` and `pruned(opt, ..., **fields)`: the fields over the
  defaults, or beside a given config, as a ConfigDict with those fields would give."""
  import optax

  params = {
    'Dense_0': {
      'kernel': jnp.asarray(np.random.default_rng(0).standard_normal((8, 8)), jnp.float32)
    }
  }
  config = jaxprune.parse_hparams(
    'target_sparsity=0.75,pruning_frequency=1,sparsity_function_end_step=1,threshold_method=exact'
  )

  def masks(tx):
    state = tx.init(params)
    for _ in range(2):
      _, state = tx.update(params, state, params)
    return np.asarray(jaxprune.get_masks(state)['Dense_0']['kernel'])

  expected = masks(jaxprune.pruning(config))
  assert expected.sum() == 16
  fields = dict(
    target_sparsity=0.75,
    pruning_frequency=1,
    sparsity_function_end_step=1,
    threshold_method='exact',
  )
  np.testing.assert_array_equal(masks(jaxprune.pruning(**fields)), expected)
  np.testing.assert_array_equal(
    masks(
      jaxprune.pruned(
        optax.sgd(0.0),
        'threshold_method=exact',
        target_sparsity=0.75,
        pruning_frequency=1,
        sparsity_function_end_step=1,
      )
    ),
    expected,
  )
  with pytest.raises(ValueError, match="did you mean 'target_sparsity'"):
    jaxprune.pruning(target_sparisty=0.8)
  with pytest.raises(ValueError, match=r'target_sparsity=1.2: must be in \[0, 1\)'):
    jaxprune.pruned(optax.sgd(0.1), target_sparsity=1.2)


@pytest.mark.parametrize(
  'hparams',
  [
    'target_sparsity=0.9',
    {'target_sparsity': 0.9},
    jaxprune.parse_hparams('target_sparsity=0.9'),
    hparams_lib.freeze('target_sparsity=0.9'),
  ],
  ids=['text', 'dict', 'config', 'HParams'],
)
def test_a_field_in_hparams_and_by_keyword_is_an_error_naming_both(hparams):
  import optax

  message = (
    r'^target_sparsity is given twice, target_sparsity=0.9 in hparams and '
    r'target_sparsity=0.5 by keyword; give it once'
  )
  with pytest.raises(ValueError, match=message):
    jaxprune.pruned(optax.adam(1e-3), hparams, target_sparsity=0.5)
  with pytest.raises(ValueError, match=message):
    jaxprune.pruning(hparams, target_sparsity=0.5)
  # The same value twice, or a keyword for a field hparams leaves at its default: no conflict.
  assert (
    hparams_lib.freeze(hparams_lib.with_fields(hparams, {'target_sparsity': 0.9})).target_sparsity
    == 0.9
  )
  assert hparams_lib.freeze(hparams_lib.with_fields(hparams, {'nbins': 64})).nbins == 64


def test_nm_sparsity_with_a_target_is_refused_as_sparse_ste_refuses_it():
  import optax

  with pytest.raises(
    ValueError,
    match=r"^nm_sparsity='2:4' keeps 2 of every 4 .* so target_sparsity=0.8 would be dropped",
  ):
    jaxprune.pruned(optax.sgd(0.1), 'target_sparsity=0.8', nm_sparsity='2:4')
  with pytest.raises(
    ValueError, match=r"so weight_sparsity_map=\['Dense_0:0.3'\] would be dropped"
  ):
    jaxprune.parse_hparams('nm_sparsity=1:4,weight_sparsity_map=[Dense_0:0.3]')
  with pytest.raises(ValueError, match='give a sparsity or an N:M pattern, not both'):
    jaxprune.sparse.ste(optax.sgd(0.1), 0.8, nm='2:4')
  assert hparams_lib.freeze('nm_sparsity=2:4').nm == (2, 4)  # the default target is no conflict


def _adam():
  import optax

  return optax.adam(1e-3)


@pytest.mark.parametrize(
  'make, message',
  [
    (
      lambda: jaxprune.pruned(_adam(), jaxprune.pruning(target_sparsity=0.8)),
      r'^jaxprune.pruned: hparams is an optax transform \(GradientTransformation\), not hparams\. '
      r'Give the hparams themselves, e\.g\. jaxprune\.pruned\(optax\.adam\(1e-3\), '
      r'target_sparsity=0\.8\)',
    ),
    (lambda: jaxprune.pruning(_adam()), r'^jaxprune.pruning: hparams is an optax transform'),
    (
      lambda: jaxprune.pruned(__import__('optax').adam, target_sparsity=0.8),
      r'^jaxprune.pruned: optimizer=optax.adam is a function that makes an optax transform, not '
      r'one; call it: jaxprune.pruned\(optax.adam\(1e-3\)',
    ),
    (lambda: jaxprune.pruned(None), r'^jaxprune.pruned: optimizer=None must be an optax transform'),
    (
      lambda: jaxprune.pruned('target_sparsity=0.8'),
      r'looks like hparams; give the optimizer first',
    ),
    (
      lambda: jaxprune.pruning(mask_rule=5),
      r'^jaxprune.pruning: mask_rule=5 must be a jaxprune.MaskRule',
    ),
    (
      lambda: jaxprune.pruning(mask_rule=jaxprune.channels.ChannelRule),
      r'make one: mask_rule=ChannelRule\(\.\.\.\)',
    ),
    (
      lambda: jaxprune.pruning(sparsity_fn=0.8),
      r'^jaxprune.pruning: sparsity_fn=0.8 must be a function step -> sparsity'
      r'.*a fixed target is target_sparsity=0.8\.$',
    ),
    (
      lambda: jaxprune.pruned(_adam(), prune_filter='kernel'),
      r"prune_filter='kernel' must be a function \(name, leaf\) -> bool"
      r".*weight_name_regex='kernel'\.$",
    ),
  ],
  ids=[
    'pruned-of-pruning',
    'pruning-of-adam',
    'factory',
    'none',
    'hparams-first',
    'mask_rule',
    'mask_rule-class',
    'sparsity_fn',
    'prune_filter',
  ],
)
def test_misused_arguments_are_one_line_with_the_fix(make, message):
  with pytest.raises(TypeError, match=message) as raised:
    make()
  assert '\n' not in str(raised.value)
