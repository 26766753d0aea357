"""Tests of the pruning optax transform against numpy references.

See docs/explanation/semantics.md#gating, #names-and-maps, #applying-the-masks and #reports.
"""

from __future__ import annotations

import warnings

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import optax
import pruning_helpers as helpers
import pytest
import references

import jaxprune
from jaxprune._numerics import INT32_MAX

F32 = np.float32


def _hparams(**overrides):
  hparams = jaxprune.get_pruning_hparams()
  hparams.update(overrides)
  return hparams


def _params(seed=0):
  rng = np.random.default_rng(seed)
  return {
    'Dense_0': {
      'kernel': jnp.asarray(rng.standard_normal((8, 12)), jnp.float32),
      'bias': jnp.asarray(rng.standard_normal(12), jnp.float32),
    },
    'Dense_1': {
      'kernel': jnp.asarray(rng.standard_normal((12, 4)), jnp.float32),
      'bias': jnp.asarray(rng.standard_normal(4), jnp.float32),
    },
  }


def _grads(params, rng):
  return jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), jnp.float32), params)


def _linspace_params():
  return {
    'Dense_0': {
      'kernel': jnp.asarray(np.linspace(1, 100, 100).reshape(10, 10), jnp.float32),
      'bias': jnp.ones(10, jnp.float32),
    }
  }


def _callback_primitives(jaxpr):
  found = []
  for eqn in jaxpr.eqns:
    if 'callback' in eqn.primitive.name or 'outfeed' in eqn.primitive.name:
      found.append(eqn.primitive.name)
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      found += _callback_primitives(sub)
  return found


def test_jitted_run_compiles_once_without_host_sync():
  hparams = _hparams(pruning_frequency=3, sparsity_function_end_step=30, target_sparsity=0.8)
  tx = optax.chain(optax.adam(1e-2), jaxprune.pruning(hparams))
  traces = []

  @jax.jit
  def train_step(params, opt_state, grads):
    traces.append(1)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  params = _params()
  opt_state = tx.init(params)
  rng = np.random.default_rng(1)
  all_grads = [_grads(params, rng) for _ in range(50)]
  params, opt_state = train_step(params, opt_state, all_grads[0])
  with jax.transfer_guard('disallow'):
    for grads in all_grads[1:]:
      params, opt_state = train_step(params, opt_state, grads)
  assert len(traces) == 1 and train_step._cache_size() == 1
  state = jaxprune.find_pruning_state(opt_state)
  assert int(state.step) == 50 and int(state.last_update_step) == 48
  jaxpr = jax.make_jaxpr(train_step)(params, opt_state, all_grads[0])
  assert _callback_primitives(jaxpr.jaxpr) == []


@pytest.mark.slow
@pytest.mark.parametrize(
  'optimizer',
  [
    optax.adam(1e-2),
    optax.sgd(0.05, momentum=0.9),
    optax.adamw(1e-2, weight_decay=0.1),
  ],
  ids=['adam', 'sgd_momentum', 'adamw'],
)
def test_pruned_weights_zero_and_kept_weights_equal_optimizer_alone(optimizer):
  # Masks change every 2 steps until step 20, then stay frozen while training goes on.
  hparams = _hparams(
    pruning_frequency=2, sparsity_function_end_step=16, target_sparsity=0.75, end_pruning_step=20
  )
  tx = optax.chain(optimizer, jaxprune.pruning(hparams))
  chain_update = helpers.jit_as_users_compile(tx.update)
  alone_update = helpers.jit_as_users_compile(optimizer.update)
  params = _params()
  opt_state = tx.init(params)
  rng = np.random.default_rng(2)
  for step in range(30):
    grads = _grads(params, rng)
    alone, _ = alone_update(grads, opt_state[0], params)
    updates, opt_state = chain_update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    expected = optax.apply_updates(params, alone)
    masks = jaxprune.get_masks(opt_state)
    for layer in ('Dense_0', 'Dense_1'):
      mask = np.asarray(masks[layer]['kernel'])
      kernel = np.asarray(new_params[layer]['kernel'])
      np.testing.assert_array_equal(kernel[~mask], 0.0)
      np.testing.assert_array_equal(kernel[mask], np.asarray(expected[layer]['kernel'])[mask])
      np.testing.assert_array_equal(new_params[layer]['bias'], expected[layer]['bias'])
      assert masks[layer]['bias'] is None
      if step >= 16:
        assert np.isclose(1.0 - mask.mean(), 0.75, atol=0.05)
    if step == 20:
      frozen = jax.tree.map(np.asarray, masks)
    if step > 20:
      jax.tree.map(np.testing.assert_array_equal, masks, frozen)
    params = new_params
  sparsity = jaxprune.get_weight_sparsity(params)
  for layer in ('Dense_0', 'Dense_1'):
    assert float(sparsity[f'{layer}/kernel']) >= 0.7


def _gating_reference(begin, frequency, end, steps):
  """last_update_step after each step and whether that step updated.

  See docs/explanation/semantics.md#gating.
  """
  last, history = 0, []
  for t in range(steps):
    update = t >= begin and (end < 0 or t <= end) and last + frequency <= t
    if update:
      last = t
    history.append((last, update))
  return history


@pytest.mark.parametrize('begin,frequency,end', [(0, 3, -1), (4, 2, 9), (1, 5, 12), (7, 1, 10)])
def test_transform_follows_numpy_simulation(begin, frequency, end):
  # The transform alone (updates = grads), a sparsity_fn, random updates: a numpy
  # simulation of docs/explanation/semantics.md#gating, #histogram-thresholds and
  # #applying-the-masks gives every mask, threshold and weight.
  hparams = _hparams(
    begin_pruning_step=begin, pruning_frequency=frequency, end_pruning_step=end, nbins=100
  )
  sparsity_fn = lambda step: jnp.minimum(0.06 * step, 0.9)
  tx = jaxprune.pruning(hparams, sparsity_fn=sparsity_fn)
  update = jax.jit(tx.update)
  params = {'layer': {'kernel': jnp.asarray(np.linspace(1, 100, 100).reshape(10, 10), jnp.float32)}}
  state = tx.init(params)
  rng = np.random.default_rng(3)
  mask, threshold = np.ones((10, 10), bool), F32(0.0)
  weights = np.asarray(params['layer']['kernel'])
  for t, (last, updated) in enumerate(_gating_reference(begin, frequency, end, 16)):
    grads = {'layer': {'kernel': jnp.asarray(rng.standard_normal((10, 10)), jnp.float32)}}
    updates, state = update(grads, state, params)
    params = optax.apply_updates(params, updates)
    new = weights + np.asarray(grads['layer']['kernel'])
    sparsity = F32(min(F32(0.06) * F32(t), F32(0.9)))
    if updated:
      threshold, mask = references.threshold_and_mask(np.abs(new), sparsity, 100, 'histogram')
    weights = np.where(mask, new, F32(0.0))
    assert int(state.last_update_step) == last, t
    assert int(state.step) == t + 1
    assert float(state.sparsity) == pytest.approx(float(sparsity))
    assert np.asarray(state.thresholds['layer']['kernel']) == threshold, t
    np.testing.assert_array_equal(state.masks['layer']['kernel'], mask)
    np.testing.assert_array_equal(params['layer']['kernel'], weights)


def test_polynomial_schedule_and_per_leaf_targets():
  # Without sparsity_fn the polynomial of docs/explanation/semantics.md#schedule drives each leaf
  # with its own target.
  hparams = _hparams(
    pruning_frequency=1,
    sparsity_function_end_step=10,
    target_sparsity=0.5,
    weight_sparsity_map=['Dense_1/kernel:0.8'],
    threshold_method='exact',
    initial_sparsity=0.1,
  )
  tx = jaxprune.pruning(hparams)
  params = _params()
  state = tx.init(params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  update = jax.jit(tx.update)
  for t in range(12):
    _, state = update(zeros, state, params)
    expected = {'Dense_0/kernel': 0.5, 'Dense_1/kernel': 0.8}
    progress = min(t / 10, 1.0)
    assert float(state.sparsity) == pytest.approx(0.5 + (0.1 - 0.5) * (1 - progress) ** 3, rel=1e-6)
    for name, kernel in (
      ('Dense_0/kernel', params['Dense_0']['kernel']),
      ('Dense_1/kernel', params['Dense_1']['kernel']),
    ):
      target = expected[name]
      sparsity = target + (0.1 - target) * (1 - progress) ** 3
      if t == 0:  # no update at step 0 (docs/explanation/semantics.md#gating)
        sparsity = 0.0
      kept = max(round(kernel.size * (1 - sparsity)), 1)
      mask = np.asarray(state.masks[name.split('/')[0]]['kernel'])
      assert mask.sum() == kept, (t, name)


def test_params_unlike_init_name_the_leaf():
  tx = jaxprune.pruning(helpers.hparams())
  state = tx.init({'a': {'kernel': jnp.ones((4, 4))}})
  other_shape = {'a': {'kernel': jnp.ones((4, 5))}}
  with pytest.raises(ValueError, match="params leaf 'a/kernel' has shape \\(4, 5\\)"):
    tx.update(other_shape, state, other_shape)
  other_tree = {'b': {'kernel': jnp.ones((4, 4))}}
  with pytest.raises(ValueError, match='params tree has another structure'):
    tx.update({'a': {'kernel': jnp.ones((4, 4))}}, state, other_tree)


def test_step_saturates_instead_of_wrapping():
  hparams = helpers.hparams(pruning_frequency=2, target_sparsity=0.5, sparsity_function_end_step=2)
  params = {'d': {'kernel': jnp.asarray(np.arange(1, 17, dtype=F32).reshape(4, 4))}}
  tx = jaxprune.pruning(hparams)
  top = INT32_MAX
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


def test_chain_with_sgd_passes_sgds_first_step_through_without_warnings():
  kernel = np.arange(1, 17, dtype=np.float32).reshape(4, 4)
  params = {'d': {'kernel': jnp.asarray(kernel)}}
  tx = optax.chain(optax.sgd(0.1), jaxprune.pruning(helpers.hparams()))
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    state = tx.init(params)
    updates, state = tx.update(params, state, params)
  # The first mask update is at step max(begin_pruning_step, pruning_frequency) = 10: step 0
  # keeps every weight and hands on sgd's -0.1 x the gradient (here the params) unchanged.
  np.testing.assert_array_equal(updates['d']['kernel'], np.float32(-0.1) * kernel)
  assert bool(state[1].masks['d']['kernel'].all()) and int(state[1].step) == 1


@pytest.mark.parametrize('form', ['pruned', 'pruned_params', 'chained_params'])
def test_no_form_holds_a_host_callback(form):
  # A callback in a jitted step costs every call, even one that never runs it: JAX then
  # leaves its fast dispatch path (docs/explanation/semantics.md#order-in-an-optax-chain).
  hparams = _hparams(pruning_frequency=3, sparsity_function_end_step=30, target_sparsity=0.8)
  if form.endswith('params'):
    hparams.mask_source = 'params'
  tx = (
    optax.chain(optax.adam(1e-2), jaxprune.pruning(hparams))
    if form.startswith('chained')
    else jaxprune.pruned(optax.adam(1e-2), hparams)
  )
  params = _params()
  state = tx.init(params)
  jaxpr = jax.make_jaxpr(tx.update)(params, state, params)
  assert _callback_primitives(jaxpr.jaxpr) == []
