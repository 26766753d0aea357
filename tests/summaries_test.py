"""The accessors: one documented shape each, and a clear error for a state without pruning."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tiny_models

import jaxprune
from jaxprune import sparse
from jaxprune._results import summaries as summaries


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


def _run(params, text):
  """Three steps of `pruned(sgd(0), hp)`, one mask update reaching the target; (state, hp)."""
  hparams = jaxprune.parse_hparams(f'pruning_frequency=1,sparsity_function_end_step=1,{text}')
  tx = jaxprune.pruned(optax.sgd(0.0), hparams)
  state = tx.init(params)
  update = jax.jit(tx.update)
  for _ in range(3):
    updates, state = update(params, state, params)
    params = optax.apply_updates(params, updates)
  return state, hparams


def _normal(shape, seed=0, outlier=None):
  w = (0.02 * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)
  if outlier is not None:
    w[outlier] = 50.0  # every other weight falls in the lowest of 256 bins
  return jnp.asarray(w)


def _shortfalls(make):
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter('always')
    make()
  return [str(w.message) for w in record if 'far below their target' in str(w.message)]


def test_global_pruning_left_at_zero_by_one_outlier_warns():
  """One threshold over both kernels: the outlier's bins leave both at 0% of a 50% target."""
  params = {
    'Dense_0': {'kernel': _normal((64, 64), outlier=(0, 0))},
    'Dense_1': {'kernel': _normal((32, 32), seed=1)},
  }
  state, hparams = _run(params, 'target_sparsity=0.5,global_pruning=true')
  (message,) = _shortfalls(lambda: jaxprune.summaries(state, hparams))
  assert (
    'all pruned leaves together (global_pruning) 0.0% (target 50.0%): '
    'Dense_0/kernel 0.0%, Dense_1/kernel 0.0%' in message
  )
  exact, hparams = _run(params, 'target_sparsity=0.5,global_pruning=true,threshold_method=exact')
  assert _shortfalls(lambda: jaxprune.summaries(exact, hparams)) == []


def test_each_stacked_layer_is_held_to_its_target():
  """8 stacked 32x32 layers, layer 3 with the outlier: it stays at 0% while the leaf's
  average is 7/8 of 50% = 43.75%, within 10 points of the target."""
  params = {'layers': {'kernel': _normal((8, 32, 32), outlier=(3, 0, 0))}}
  state, hparams = _run(params, 'target_sparsity=0.5,layer_axes_map=[layers/kernel:1]')
  (message,) = _shortfalls(lambda: jaxprune.summaries(state, hparams))
  assert (
    'these leaves are far below their target sparsity: layers/kernel[3] 0.0% (target 50.0%).'
    in message
  )


def test_a_leaf_as_close_to_its_target_as_rounding_allows_is_quiet():
  """A 1x3 kernel at 50%: 1 of 3 weights pruned is 33.3%, the closest at or under 50%."""
  state, hparams = _run(
    {'Dense_0': {'kernel': _normal((1, 3))}}, 'target_sparsity=0.5,threshold_method=exact'
  )
  assert float(jaxprune.get_weight_sparsity(state)['Dense_0/kernel']) == np.float32(1 / 3)
  assert _shortfalls(lambda: jaxprune.summaries(state, hparams)) == []


def test_without_hparams_a_lower_map_target_is_quiet_and_a_dense_model_is_not():
  params = {'Dense_0': {'kernel': _normal((32, 32))}, 'Dense_1': {'kernel': _normal((32, 32), 1)}}
  state, _ = _run(
    params, 'target_sparsity=0.8,weight_sparsity_map=[Dense_1:0.3],threshold_method=exact'
  )
  assert float(jaxprune.get_weight_sparsity(state)['Dense_1/kernel']) == pytest.approx(
    0.3, abs=1e-3
  )
  assert _shortfalls(lambda: jaxprune.summaries(state)) == []
  outlier = {'Dense_0': {'kernel': _normal((32, 32), outlier=(0, 0))}}
  state, _ = _run(outlier, 'target_sparsity=0.5')
  (message,) = _shortfalls(lambda: jaxprune.summaries(state))
  assert 'Dense_0/kernel 0.0% (target 50.0%)' in message
