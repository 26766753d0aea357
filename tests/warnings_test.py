"""Warnings name the user's line (`jaxprune._warnings`), whichever path led to them: the
keyword and the chained forms, optax's chain, a step traced by `jax.jit`, one-shot and
structured pruning, the accessors."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest

import jaxprune
from jaxprune import _warnings as warnings_lib

PARAMS = {'Dense_0': {'kernel': jnp.ones((4, 4)), 'bias': jnp.zeros(4)}}


def _ours(caught):
  found = [w for w in caught if 'jaxprune' in str(w.message) or 'prune' in str(w.message)]
  assert found, [str(w.message) for w in caught]
  return found


def test_user_stacklevel_counts_the_library_frames_between():
  def library_call():  # stands for jaxprune code: its file is this test's
    return warnings_lib.user_stacklevel()

  assert library_call() == 1  # this file is not a library: the caller of user_stacklevel


@pytest.mark.parametrize(
  'make',
  [
    lambda: jaxprune.pruned(optax.sgd(0.1), weight_sparsity_map=['nothing_here:0.5']),
    lambda: optax.chain(optax.sgd(0.1), jaxprune.pruning(weight_sparsity_map=['nothing_here:0.5'])),
    lambda: jaxprune.pruning('weight_sparsity_map=[nothing_here:0.5]'),
  ],
  ids=['pruned', 'chain', 'pruning'],
)
def test_a_map_entry_matching_nothing_names_the_init_line(make):
  tx = make()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    tx.init(PARAMS)
  (found,) = [w for w in caught if 'nothing_here' in str(w.message)]
  assert found.filename == __file__


def test_a_chain_order_warning_names_the_users_step_under_jit():
  tx = optax.chain(jaxprune.pruning(target_sparsity=0.5), optax.adam(0.1))
  state = tx.init(PARAMS)

  def step(params, state):
    return tx.update(params, state, params)  # the line the warning names

  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    jax.jit(step)(PARAMS, state)
  (found,) = [w for w in caught if 'followed by another transform' in str(w.message)]
  assert found.filename == __file__
  assert found.lineno == step.__code__.co_firstlineno + 1


def test_a_selector_that_matches_nothing_and_a_shortfall_name_the_call():
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    jaxprune.pruned(optax.sgd(0.1), weight_name_regex='nothing').init(PARAMS)
  (found,) = [w for w in caught if 'selects none of the leaves' in str(w.message)]
  assert found.filename == __file__


def test_a_structured_target_out_of_reach_names_the_call():
  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(3)(jnp.sin(nn.Dense(8)(x)))

  model = Model()
  x = jnp.ones((2, 4))
  variables = model.init(jax.random.key(0), x)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    graph = jaxprune.structured.trace(model.apply, variables, x)
    jaxprune.structured.select(graph, variables, scope='global', n_channels=100)
  for found in caught:
    assert found.filename == __file__, (found.filename, str(found.message))
  assert caught
