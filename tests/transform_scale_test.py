"""Mask updates at model scale: stacked layers, stored dtypes, mask sources, one loop."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import references

import jaxprune

F32 = np.float32
LAYERS = 3


def _hparams(**overrides):
  hparams = jaxprune.get_pruning_hparams()
  hparams.update(overrides)
  return hparams


def _layer(rng, scale):
  return {
    'attn': {'kernel': (scale * rng.standard_normal((16, 24))).astype(F32)},
    'mlp': {
      'kernel': (scale * rng.standard_normal((24, 32))).astype(F32),
      'bias': rng.standard_normal(32).astype(F32),
    },
  }


def _trees():
  """The same 3-layer model unstacked ('h/0', 'h/1', ...) and stacked (leading axis)."""
  rng = np.random.default_rng(0)
  # Layers of different scales: one threshold across layers would prune them unevenly.
  layers = [_layer(rng, scale) for scale in (0.5, 1.0, 2.0)]
  unstacked = {
    'h': {str(i): layer for i, layer in enumerate(layers)},
    'head': {'kernel': rng.standard_normal((32, 10)).astype(F32)},
  }
  stacked = {'h': jax.tree.map(lambda *xs: np.stack(xs), *layers), 'head': unstacked['head']}
  return jax.tree.map(jnp.asarray, unstacked), jax.tree.map(jnp.asarray, stacked)


def _grads(steps, seed=1):
  """Random gradients for both layouts: the stacked ones are the unstacked ones stacked."""
  unstacked, _ = _trees()
  rng = np.random.default_rng(seed)
  flat = [
    jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), unstacked)
    for _ in range(steps)
  ]
  deep = [
    {
      'h': jax.tree.map(lambda *xs: jnp.stack(xs), *[g['h'][str(i)] for i in range(LAYERS)]),
      'head': g['head'],
    }
    for g in flat
  ]
  return flat, deep


def _run(hparams, params, grads):
  tx = optax.chain(optax.sgd(0.05), jaxprune.pruning(hparams))
  state = tx.init(params)

  @jax.jit
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for g in grads:
    params, state = step(params, state, g)
  return params, jaxprune.find_pruning_state(state)


def _unstack(tree):
  """A stacked tree's 'h' leaves split back into per-layer leaves."""
  return {
    'h': {str(i): jax.tree.map(lambda x, i=i: x[i], tree['h']) for i in range(LAYERS)},
    'head': tree['head'],
  }


@pytest.mark.slow
@pytest.mark.parametrize(
  'overrides',
  [
    {},
    {'threshold_method': 'exact'},
    {'block_dims_map': ['mlp/kernel:4x2']},
    {'weight_sparsity_map': ['attn:0.6', 'mlp:0.8'], 'threshold_decay': 0.5},
    {'nm_sparsity_map': ['attn/kernel:1:4']},
  ],
  ids=['histogram', 'exact', 'blocks', 'maps_decay', 'nm'],
)
def test_stacked_layers_equal_unstacked_bit_for_bit(overrides):
  unstacked, stacked = _trees()
  common = dict(pruning_frequency=1, sparsity_function_end_step=3, target_sparsity=0.7, **overrides)
  flat_grads, deep_grads = _grads(4)
  flat_params, flat_state = _run(_hparams(**common), unstacked, flat_grads)
  deep_params, deep_state = _run(_hparams(layer_axes_map=['h/:1'], **common), stacked, deep_grads)
  jax.tree.map(np.testing.assert_array_equal, _unstack(deep_params), flat_params)
  jax.tree.map(
    np.testing.assert_array_equal,
    _unstack(deep_state.masks),
    flat_state.masks,
    is_leaf=lambda x: x is None,
  )
  if 'nm_sparsity_map' not in overrides:
    for name in ('attn', 'mlp'):
      per_layer = [flat_state.thresholds['h'][str(i)][name]['kernel'] for i in range(LAYERS)]
      np.testing.assert_array_equal(deep_state.thresholds['h'][name]['kernel'], per_layer)


def test_stacked_leaf_gets_one_threshold_per_layer():
  _, stacked = _trees()
  state = jaxprune.pruning(_hparams(layer_axes_map=['h/:1'])).init(stacked)
  assert state.thresholds['h']['mlp']['kernel'].shape == (LAYERS,)
  assert state.thresholds['head']['kernel'].shape == ()
  with pytest.raises(ValueError, match='layer_axes_map entry h/:x'):
    jaxprune.parse_hparams('layer_axes_map=[h/:x]')


@pytest.mark.slow
def test_global_pruning_over_stacked_layers_is_one_threshold():
  unstacked, stacked = _trees()
  common = dict(
    pruning_frequency=1,
    sparsity_function_end_step=1,
    target_sparsity=0.5,
    global_pruning=True,
    threshold_method='exact',
  )
  flat_grads, deep_grads = _grads(2)
  _, flat = _run(_hparams(**common), unstacked, flat_grads)
  _, deep = _run(_hparams(layer_axes_map=['h/:1'], **common), stacked, deep_grads)
  jax.tree.map(
    np.testing.assert_array_equal, _unstack(deep.masks), flat.masks, is_leaf=lambda x: x is None
  )
  thresholds = np.asarray(deep.thresholds['h']['mlp']['kernel'])
  assert (thresholds == thresholds[0]).all()


@pytest.mark.slow
def test_bfloat16_masks_threshold_the_stored_weights():
  rng = np.random.default_rng(3)
  params = {'d': {'kernel': jnp.asarray(rng.standard_normal((64, 64)), jnp.bfloat16)}}
  updates = {'d': {'kernel': jnp.asarray(1e-3 * rng.standard_normal((64, 64)), jnp.float32)}}
  tx = jaxprune.pruning(
    _hparams(
      pruning_frequency=1,
      sparsity_function_end_step=1,
      target_sparsity=0.8,
      threshold_method='exact',
    )
  )
  state = tx.init(params)
  step = jax.jit(tx.update)
  _, state = step(jax.tree.map(jnp.zeros_like, updates), state, params)
  _, state = step(updates, state, params)
  stored = optax.apply_updates(params, updates)['d']['kernel']  # bf16, as the user holds it
  assert stored.dtype == jnp.bfloat16
  _, expected = jaxprune.update_mask(stored, 0.0, 0.8, threshold_method='exact')
  np.testing.assert_array_equal(state.masks['d']['kernel'], expected)


def test_params_source_thresholds_the_weights_the_step_starts_from():
  # mask_source='params': masks come from the params passed to update, and the
  # update of the same step zeroes what they prune.
  rng = np.random.default_rng(4)
  w = rng.standard_normal((10, 10)).astype(F32)
  params = {'layer': {'kernel': jnp.asarray(w)}}
  tx = jaxprune.pruning(
    _hparams(
      pruning_frequency=1,
      sparsity_function_end_step=1,
      target_sparsity=0.5,
      nbins=100,
      mask_source='params',
    )
  )
  state = tx.init(params)
  grads = {'layer': {'kernel': jnp.asarray(rng.standard_normal((10, 10)), jnp.float32)}}
  step = jax.jit(tx.update)
  _, state = step(grads, state, params)  # step 0: no update
  updates, state = step(grads, state, params)
  threshold, mask = references.threshold_and_mask(np.abs(w), 0.5, 100, 'histogram')
  assert np.asarray(state.thresholds['layer']['kernel']) == threshold
  np.testing.assert_array_equal(state.masks['layer']['kernel'], mask)
  new = np.asarray(optax.apply_updates(params, updates)['layer']['kernel'])
  np.testing.assert_array_equal(new, np.where(mask, w + np.asarray(grads['layer']['kernel']), 0))


def _while_loops(hparams, leaves):
  params = {f'layer_{i}': {'kernel': jnp.ones((8 + i, 16))} for i in range(leaves)}
  tx = jaxprune.pruning(hparams)
  state = tx.init(params)
  text = jax.jit(tx.update).lower(params, state, params).as_text()
  return len(re.findall(r'stablehlo\.while', text))


@pytest.mark.slow
@pytest.mark.parametrize(
  'overrides',
  [
    {},
    {'threshold_method': 'exact'},
    {'global_pruning': True},
    {'block_dims_map': ['layer_1:2x2']},
  ],
)
def test_compiled_loops_do_not_grow_with_the_number_of_leaves(overrides):
  hparams = _hparams(**overrides)
  assert _while_loops(hparams, 2) == _while_loops(hparams, 12)
