"""The accessors: one documented shape each, and a clear error for a state without pruning."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tiny_models

import jaxprune


def _pruned_state():
  params = tiny_models.mlp_params()
  tx = optax.chain(optax.adam(1e-3), jaxprune.pruning(
      'target_sparsity=0.75,pruning_frequency=1,sparsity_function_end_step=1,'
      'threshold_method=exact'))
  state = tx.init(params)
  grads = jax.tree.map(jnp.zeros_like, params)
  update = jax.jit(tx.update)
  for _ in range(2):
    _, state = update(grads, state, params)
  return params, state


def test_an_optimizer_state_without_pruning_is_an_error():
  # Before: get_weight_sparsity(adam state) measured mu and nu: "1.0 sparse".
  state = optax.adam(1e-3).init(tiny_models.mlp_params())
  for accessor in (jaxprune.get_weight_sparsity, jaxprune.get_masks, jaxprune.get_thresholds,
                   jaxprune.summaries, lambda s: jaxprune.apply_masks(tiny_models.mlp_params(), s)):
    with pytest.raises(ValueError, match='found 0: pass the state of optax.chain'):
      accessor(state)


def test_shapes_masks_as_a_tree_reports_by_leaf_name():
  params, state = _pruned_state()
  masks = jaxprune.get_masks(state)
  is_none = lambda x: x is None
  assert jax.tree.structure(masks, is_leaf=is_none) == jax.tree.structure(params)
  assert masks['Dense_0']['bias'] is None
  pruned = ['Dense_0/kernel', 'Dense_1/kernel']
  assert sorted(jaxprune.get_thresholds(state)) == pruned
  sparsity = jaxprune.get_weight_sparsity(state)
  # exact rule: 4 * 8 = 32 weights keep round(32 * 0.25) = 8; 8 * 3 = 24 keep 6.
  assert {k: float(v) for k, v in sparsity.items()} == {n: 0.75 for n in pruned}
  masked = jaxprune.apply_masks(params, state)
  # The same meaning for params: the zeros the masks put there.
  assert {k: float(v) for k, v in jaxprune.get_weight_sparsity(masked).items()} == {
      n: 0.75 for n in pruned}
  assert int(np.sum(masks['Dense_0']['kernel'])) == 8
