"""Nothing falls short in silence (issue 55, round 3): each case gives the right result or
one line naming the fix."""

import warnings

import jax
import jax.numpy as jnp
import optax
import pytest

import jaxprune


def _updates_at_0_10_20(**extra):
  text = (
    'begin_pruning_step=0,end_pruning_step=20,pruning_frequency=10,target_sparsity=0.5,'
    'sparsity_function_end_step=20,weight_name_regex=kernel,threshold_method=exact'
  )
  return jaxprune.parse_hparams(text, **extra) if extra else jaxprune.parse_hparams(text)


def test_a_1x1_kernel_pruned_last_is_not_called_moved():
  params = {'head': {'kernel': jnp.full((1, 1), 0.7)}}
  tx = optax.chain(optax.adam(1e-2), jaxprune.pruning(_updates_at_0_10_20()))
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    grads = jax.tree.map(jnp.ones_like, params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for _ in range(21):
    params, state = step(params, state)
  pruning_state = jaxprune.find_pruning_state(state)
  assert int(pruning_state.last_update_step) == 20
  assert int(pruning_state.moved_updates) == 0
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    jaxprune.summaries(state)


@pytest.mark.parametrize(
  ('kept', 'value', 'moved'), [(True, 0.7, False), (False, 0.7, True), (False, 0.0, False)]
)
def test_one_element_moved_reduction(kept, value, moved):
  from jaxprune import _order

  masks, params = [jnp.full((1, 1), kept)], [jnp.full((1, 1), value)]
  assert bool(jax.jit(_order.any_moved)(masks, params)) is moved


def test_all_equal_weights_are_named_as_ties_in_the_shortfall_warning():
  # Every weight equals the threshold: the exact rule keeps each tied weight, so 0% of 50%.
  params = {'dense': {'kernel': jnp.full((4, 4), 0.5)}}
  hparams = _updates_at_0_10_20()
  tx = jaxprune.pruning(hparams)
  state = tx.init(params)
  grads = jax.tree.map(jnp.zeros_like, params)
  update = jax.jit(tx.update)
  for _ in range(21):
    _, state = update(grads, state, params)
  assert float(jnp.mean(jaxprune.get_masks(state)['dense']['kernel'])) == 1.0
  with pytest.warns(UserWarning, match=r'dense/kernel.*tied.*equal'):
    jaxprune.summaries(state)
