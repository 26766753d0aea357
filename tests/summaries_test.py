"""The accessors: one documented shape each, and a clear error for a state without pruning."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tiny_models

import jaxprune
from jaxprune import _summaries as summaries
from jaxprune import sparse


def _pruned_state():
  params = tiny_models.mlp_params()
  tx = optax.chain(
    optax.adam(1e-3),
    jaxprune.pruning(
      'target_sparsity=0.75,pruning_frequency=1,sparsity_function_end_step=1,threshold_method=exact'
    ),
  )
  state = tx.init(params)
  grads = jax.tree.map(jnp.zeros_like, params)
  update = jax.jit(tx.update)
  for _ in range(2):
    _, state = update(grads, state, params)
  return params, state


def test_an_optimizer_state_without_pruning_is_an_error():
  # Before: get_weight_sparsity(adam state) measured mu and nu: "1.0 sparse".
  state = optax.adam(1e-3).init(tiny_models.mlp_params())
  for accessor in (
    jaxprune.get_weight_sparsity,
    jaxprune.get_masks,
    jaxprune.get_thresholds,
    jaxprune.summaries,
    lambda s: jaxprune.apply_masks(tiny_models.mlp_params(), s),
  ):
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
    n: 0.75 for n in pruned
  }
  assert int(np.sum(masks['Dense_0']['kernel'])) == 8


def _outlier_run(method):
  """A 512x512 kernel (normal x 0.02) with one weight of 50.0, pruned to 0.5."""
  rng = np.random.default_rng(0)
  w = (0.02 * rng.standard_normal((512, 512))).astype(np.float32)
  w[0, 0] = 50.0
  params = {
    'Dense_0': {'kernel': jnp.asarray(w)},
    'Dense_1': {'kernel': jnp.asarray(rng.standard_normal((64, 64)), jnp.float32)},
  }
  hparams = jaxprune.parse_hparams(
    'target_sparsity=0.5,pruning_frequency=1,'
    f'sparsity_function_end_step=1,threshold_method={method}'
  )
  tx = jaxprune.pruned(optax.sgd(0.0), hparams)
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    updates, state = tx.update(params, state, params)
    return optax.apply_updates(params, updates), state

  for _ in range(3):
    params, state = step(params, state)
  return state, hparams


def test_a_leaf_left_dense_by_an_outlier_is_named_with_the_remedy():
  """TF's histogram puts every weight but the outlier in the lowest of 256 bins: the
  threshold is 0 and the kernel stays dense. The summaries say so, naming the leaf."""
  state, hparams = _outlier_run('histogram')
  with pytest.warns(
    UserWarning,
    match=r'Dense_0/kernel 0.0% \(target 50.0%\).*'
    r"threshold_method='exact'",
  ) as record:
    out = jaxprune.summaries(state, hparams)
  assert float(out['Dense_0/kernel/sparsity']) == 0.0
  assert all('Dense_1' not in str(r.message) for r in record)


def test_no_shortfall_warning_at_the_target():
  state, hparams = _outlier_run('exact')
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    out = jaxprune.summaries(state, hparams)
  assert float(out['Dense_0/kernel/sparsity']) == 0.5


def test_find_state_is_the_one_search_of_the_accessors():
  params = {'Dense_0': {'kernel': jnp.ones((4, 4))}}
  pruning_state = jaxprune.pruning().init(params)
  state = (optax.adam(1e-3).init(params), pruning_state)
  assert summaries.find_state(state, jaxprune.PruningState, 'x', 'y') is pruning_state
  assert summaries.find_state(pruning_state, jaxprune.PruningState, 'x', 'y') is pruning_state
  with pytest.raises(
    ValueError, match=r'^expected exactly one x in the optimizer state, found 0: y$'
  ):
    summaries.find_state(state[0], jaxprune.PruningState, 'x', 'y')
  with pytest.raises(ValueError, match=r'found 2; pass the x itself\.$'):
    summaries.find_state((pruning_state, pruning_state), jaxprune.PruningState, 'x', 'y')
  sparse_state = sparse.static(optax.sgd(0.1), 0.5).init(params)
  assert sparse.find_state(((), sparse_state)) is sparse_state
  for find, other in ((sparse.find_state, state), (jaxprune.find_pruning_state, sparse_state)):
    with pytest.raises(ValueError, match='found 0: pass the state of'):
      find(other)
