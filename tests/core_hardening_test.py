"""Bad inputs to the core get one clear error; odd leaves and long runs behave as documented."""

from __future__ import annotations

import warnings

import core_refs
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

import jaxprune
from jaxprune import _hparams as hparams_lib

F32 = np.float32
ONE_SHOT = dict(pruning_frequency=1, sparsity_function_end_step=1)


def _hparams(**overrides):
  hparams = jaxprune.get_pruning_hparams()
  hparams.update(overrides)
  return hparams


def _updates(tx, params, steps):
  state = tx.init(params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  update = jax.jit(tx.update)
  for _ in range(steps):
    _, state = update(zeros, state, params)
  return state


@pytest.mark.parametrize('field, value, message', [
    ('sparsity_function_exponent', float('nan'), 'finite'),
    ('sparsity_function_exponent', -3.0, 'must be > 0'),
    ('sparsity_function_exponent', 0.0, 'must be > 0'),
    ('begin_pruning_step', 3_000_000_000, 'int32'),
    ('sparsity_function_end_step', 2 ** 31, 'int32'),
    ('nbins', 2 ** 31, 'int32'),
    ('nbins', 2 ** 24 + 1, r'\[2, 2\*\*24\]'),
    ('block_height', 3_000_000_000, 'int32'),
    ('pruning_frequency', True, 'must be an integer'),
    ('nbins', None, 'must be an integer'),
    ('target_sparsity', None, 'must be a number'),
    ('threshold_method', None, 'must be a string'),
    ('weight_sparsity_map', None, 'list'),
    ('global_pruning', 1, 'True or False'),
])
def test_field_types_and_int32_limits(field, value, message):
  hparams = jaxprune.get_pruning_hparams().to_dict()  # a plain dict: no type checks of its own
  hparams[field] = value
  with pytest.raises(ValueError, match=f'{field}=.*{message}'):
    jaxprune.pruning(hparams)


def test_none_in_a_config_dict_names_the_field():
  hparams = jaxprune.get_pruning_hparams()
  hparams.nbins = None  # ConfigDict accepts None in any field
  with pytest.raises(ValueError, match='nbins=None: must be an integer'):
    jaxprune.pruning(hparams)


def test_block_map_beyond_int32_is_rejected():
  with pytest.raises(ValueError, match='block_dims_map entry.*2\\*\\*31'):
    jaxprune.parse_hparams('block_dims_map=[kernel:3000000000x1]')


def test_block_larger_than_the_weights_is_the_whole_dimension():
  w = jnp.asarray(np.random.default_rng(0).standard_normal((10, 8)), jnp.float32)
  huge = jaxprune.update_mask(w, 0.0, 0.5, block_dims=(2_000_000_000, 1))
  whole = jaxprune.update_mask(w, 0.0, 0.5, block_dims=(-1, 1))
  np.testing.assert_array_equal(huge[1], whole[1])
  assert huge[0] == whole[0]


def test_a_name_given_twice_is_an_error():
  with pytest.raises(ValueError, match='target_sparsity is assigned twice'):
    jaxprune.parse_hparams('target_sparsity=0.5,target_sparsity=0.9')


def test_misspelled_field_is_refused_with_the_right_name():
  hparams = jaxprune.get_pruning_hparams()
  with pytest.raises(AttributeError, match='target_sparsity'):
    hparams.target_sparisty = 0.95
  unlocked = ml_collections.ConfigDict({'target_sparisty': 0.95})
  with pytest.raises(ValueError, match="'target_sparisty': did you mean 'target_sparsity'"):
    jaxprune.pruning(unlocked)


def test_a_partial_config_takes_the_other_defaults():
  frozen = hparams_lib.freeze(ml_collections.ConfigDict({'target_sparsity': 0.8}))
  assert (frozen.target_sparsity, frozen.nbins, frozen.threshold_method) == (0.8, 256,
                                                                             'histogram')


def test_tfmot_m_by_n_is_translated_not_misread():
  with pytest.raises(ValueError, match="m ZEROS in every n.*nm_sparsity='<n-m>:<n>'"):
    jaxprune.parse_hparams('sparsity_m_by_n=1:4')
  # nm_sparsity keeps N of every M: 1:4 is 75% sparse, 3:4 is tfmot's (1, 4).
  w = jnp.asarray(np.arange(1, 33, dtype=F32).reshape(8, 4))
  for text, kept in (('1:4', 8), ('3:4', 24)):
    state = _updates(jaxprune.pruning(_hparams(nm_sparsity=text, **ONE_SHOT)),
                     {'d': {'kernel': w}}, 2)
    assert int(state.masks['d']['kernel'].sum()) == kept


def test_window_that_can_never_update_is_an_error():
  with pytest.raises(ValueError, match=r'end_pruning_step=5: comes before the first mask update'
                                       r', at step .* = 10'):
    jaxprune.parse_hparams('pruning_frequency=10,end_pruning_step=5')


def test_stopping_before_the_schedule_ends_warns():
  with pytest.warns(UserWarning, match='end_pruning_step=50 stops mask updates before '
                                       'sparsity_function_end_step=100'):
    jaxprune.parse_hparams('end_pruning_step=50')


def test_unmatched_map_entry_warns_with_unpruned_leaves_present():
  params = {'Dense_0': {'kernel': jnp.ones((4, 4)), 'bias': jnp.ones(4)}}
  hparams = _hparams(weight_sparsity_map=['no_such:0.5'], block_dims_map=['nothing:2x2'])
  with pytest.warns(UserWarning) as record:
    jaxprune.pruning(hparams).init(params)
  message = str(record[0].message)
  assert "weight_sparsity_map entry 'no_such'" in message
  assert "block_dims_map entry 'nothing'" in message
  assert "['Dense_0/kernel']" in message


def test_blocks_on_a_conv_kernel_warn_naming_the_leaf():
  params = {'Conv_0': {'kernel': jnp.ones((3, 3, 4, 8))}, 'Dense_0': {'kernel': jnp.ones((8, 4))}}
  with pytest.warns(UserWarning, match=r"elementwise masks: \['Conv_0/kernel \(3, 3, 4, 8\)'\]"):
    jaxprune.pruning(_hparams(block_height=2, block_width=2)).init(params)


@pytest.mark.parametrize('kwargs, message', [
    (dict(block_pooling_function='MIN'), 'block_pooling_function'),
    (dict(threshold_method='sort'), 'threshold_method'),
    (dict(nbins=1), 'nbins'),
    (dict(threshold_decay=1.0), 'threshold_decay'),
    (dict(block_dims=(0, 2)), 'block_dims'),
])
def test_update_mask_checks_its_arguments(kwargs, message):
  with pytest.raises(ValueError, match=message):
    jaxprune.update_mask(jnp.ones((4, 4)), 0.0, 0.5, **kwargs)


@pytest.mark.parametrize('sparsity', [1.5, -0.2, 1.0, float('nan')])
def test_update_mask_checks_a_concrete_sparsity(sparsity):
  with pytest.raises(ValueError, match='sparsity'):
    jaxprune.update_mask(jnp.ones((4, 4)), 0.0, sparsity)


def test_zero_size_leaf_is_not_pruned():
  params = {'empty': {'kernel': jnp.ones((0, 5))}, 'd': {'kernel': jnp.arange(16.0).reshape(4, 4)}}
  state = _updates(jaxprune.pruning(_hparams(threshold_method='exact', **ONE_SHOT)), params, 2)
  assert state.masks['empty']['kernel'] is None
  assert int(state.masks['d']['kernel'].sum()) == 8


@pytest.mark.parametrize('dtype', [jnp.bool_, jnp.int32, jnp.complex64])
def test_non_real_float_leaf_names_the_leaf(dtype):
  params = {'odd': {'kernel': jnp.ones((4, 4), dtype)}}
  with pytest.raises(ValueError, match=f"leaf 'odd/kernel' has dtype {np.dtype(dtype)}"):
    jaxprune.pruning(_hparams()).init(params)


def test_params_unlike_init_name_the_leaf():
  tx = jaxprune.pruning(_hparams())
  state = tx.init({'a': {'kernel': jnp.ones((4, 4))}})
  other_shape = {'a': {'kernel': jnp.ones((4, 5))}}
  with pytest.raises(ValueError, match="params leaf 'a/kernel' has shape \\(4, 5\\)"):
    tx.update(other_shape, state, other_shape)
  other_tree = {'b': {'kernel': jnp.ones((4, 4))}}
  with pytest.raises(ValueError, match='params tree has another structure'):
    tx.update({'a': {'kernel': jnp.ones((4, 4))}}, state, other_tree)


def test_step_saturates_instead_of_wrapping():
  hparams = _hparams(pruning_frequency=2, target_sparsity=0.5, **{'sparsity_function_end_step': 2})
  params = {'d': {'kernel': jnp.asarray(np.arange(1, 17, dtype=F32).reshape(4, 4))}}
  tx = jaxprune.pruning(hparams)
  top = hparams_lib.INT32_MAX
  state = tx.init(params)._replace(step=jnp.int32(top - 3), last_update_step=jnp.int32(top - 5))
  zeros = jax.tree.map(jnp.zeros_like, params)
  update = jax.jit(tx.update)
  last = []
  for _ in range(5):
    _, state = update(zeros, state, params)
    last.append(int(state.last_update_step))
  # Updates at top - 3 and top - 1; the step then stays at top, where one more update
  # happens two steps after the last, and nothing after that.
  assert int(state.step) == top
  assert last == [top - 3, top - 3, top - 1, top - 1, top - 1]
  assert int(state.masks['d']['kernel'].sum()) == 8


def test_exact_rule_on_a_large_tensor_uses_the_full_count():
  # Large enough for the search to start from an estimate made on every 16th row;
  # those rows are 10x larger here, so the estimate is far off and only the full
  # count can find the answer.
  rng = np.random.default_rng(3)
  w = rng.standard_normal((1024, 1024)).astype(F32)
  w[::16] *= 10
  threshold, mask = jax.jit(lambda w: jaxprune.update_mask(
      w, 0.0, 0.5, threshold_method='exact'))(w)
  assert threshold == core_refs.exact_rule(np.abs(w), 0.5)
  assert int(mask.sum()) == 524_288


@pytest.mark.parametrize('size, kept', [(13, 6), (11, 6), (3, 2)])
def test_keep_count_rounds_half_to_even(size, kept):
  # tfmot's tf.round: 13 * 0.5 = 6.5 -> 6, 11 * 0.5 = 5.5 -> 6, 3 * 0.5 = 1.5 -> 2.
  w = jnp.asarray(np.arange(1, size + 1, dtype=F32).reshape(1, size))
  _, mask = jaxprune.update_mask(w, 0.0, 0.5, threshold_method='exact')
  assert int(mask.sum()) == kept


def test_nm_leaf_with_nan_is_counted_and_keeps_its_mask():
  w = np.arange(1, 33, dtype=F32).reshape(8, 4)
  params = {'d': {'kernel': jnp.asarray(w)}}
  tx = jaxprune.pruning(_hparams(nm_sparsity='2:4', pruning_frequency=1))
  state = _updates(tx, params, 2)
  before = np.asarray(state.masks['d']['kernel'])
  w[0, 0] = np.nan
  params = {'d': {'kernel': jnp.asarray(w)}}
  zeros = jax.tree.map(jnp.zeros_like, params)
  _, state = jax.jit(tx.update)(zeros, state, params)
  assert int(state.nonfinite_skips) == 1
  np.testing.assert_array_equal(state.masks['d']['kernel'], before)


def test_chain_with_sgd_still_runs_without_warnings():
  params = {'d': {'kernel': jnp.ones((4, 4))}}
  tx = optax.chain(optax.sgd(0.1), jaxprune.pruning(_hparams()))
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    state = tx.init(params)
    tx.update(params, state, params)


@pytest.mark.parametrize('kept, expected', [(3, F32(2e-35)), (4, F32(1e-35)), (6, F32(0.0))])
def test_exact_answer_far_below_the_maximum(kept, expected):
  # The k-th largest magnitude is below 2**-100 of the largest: counted by the
  # search's comparison path, it must still be the element itself.
  w = np.array([[1.0, -3e-35, 2e-35, -1e-35, 0.0, 0.0, 0.0, 0.0]], F32)
  sparsity = 1.0 - kept / 8
  threshold, mask = jaxprune.update_mask(jnp.asarray(w), 0.0, sparsity, threshold_method='exact')
  assert threshold == expected
  np.testing.assert_array_equal(mask, np.abs(w) >= expected)
