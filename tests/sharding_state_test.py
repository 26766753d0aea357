"""Tests of jaxprune._results.sharding: the shardings of the pruning state from the params'.

These run in the main test process, on a 1x1 mesh of its single CPU device;
the 8-device behaviour is tested through tests/sharding_multidevice.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxprune

MESH = jax.make_mesh((1, 1), ('data', 'model'), axis_types=(AxisType.Auto,) * 2)
REPLICATED = P()


def _params():
  return {
    'Dense_0': {'kernel': jnp.ones((8, 16)), 'bias': jnp.ones(16)},
    'Dense_1': {'kernel': jnp.ones((16, 4)), 'bias': jnp.ones(4)},
  }


def _specs():
  return {
    'Dense_0': {'kernel': P(None, 'model'), 'bias': P('model')},
    'Dense_1': {'kernel': P('data', None), 'bias': P()},
  }


def _params_shardings():
  return jax.tree.map(lambda s: NamedSharding(MESH, s), _specs())


def _hparams():
  return jaxprune.get_pruning_hparams()


def _spec_tree(shardings):
  return jax.tree.map(lambda s: s.spec, shardings)


def test_masks_like_params_thresholds_and_counters_replicated():
  state = jaxprune.pruning(_hparams()).init(_params())
  shardings = jaxprune.state_shardings(state, _params_shardings())
  assert isinstance(shardings, jaxprune.PruningState)
  assert _spec_tree(shardings.masks) == {
    'Dense_0': {'kernel': P(None, 'model'), 'bias': None},
    'Dense_1': {'kernel': P('data', None), 'bias': None},
  }
  assert _spec_tree(shardings.thresholds) == {
    'Dense_0': {'kernel': REPLICATED, 'bias': None},
    'Dense_1': {'kernel': REPLICATED, 'bias': None},
  }
  for field in ('step', 'last_update_step', 'nonfinite_skips', 'sparsity'):
    assert getattr(shardings, field).spec == REPLICATED, field
  assert all(s.mesh == MESH for s in jax.tree.leaves(shardings))


def test_pruning_state_inside_an_optax_chain_and_adam_moments():
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3), jaxprune.pruning(_hparams()))
  shapes = jax.eval_shape(tx.init, _params())
  shardings = jaxprune.state_shardings(shapes, _params_shardings())
  assert jax.tree.structure(shardings) == jax.tree.structure(shapes)
  adam = shardings[1][0]
  assert _spec_tree(adam.mu) == _specs()
  assert _spec_tree(adam.nu) == _specs()
  assert adam.count.spec == REPLICATED
  pruning = jaxprune.pruning_state_shardings(shardings, _params_shardings())
  assert _spec_tree(pruning.masks)['Dense_1'] == {'kernel': P('data', None), 'bias': None}
  assert shardings[2].masks == pruning.masks


@pytest.mark.parametrize(
  'wrap',
  [
    lambda tx: optax.MultiSteps(tx, every_k_schedule=2),
    lambda tx: optax.inject_hyperparams(
      lambda learning_rate: optax.chain(optax.sgd(learning_rate, momentum=0.9), tx)
    )(0.1),
    lambda tx: optax.chain(
      optax.masked(
        optax.adam(1e-3),
        {'Dense_0': {'kernel': True, 'bias': False}, 'Dense_1': {'kernel': True, 'bias': False}},
      ),
      tx,
    ),
  ],
  ids=['multi_steps', 'inject_hyperparams', 'masked'],
)
def test_pruning_state_nested_in_wrappers(wrap):
  tx = wrap(jaxprune.pruning(_hparams()))
  shapes = jax.eval_shape(tx.init, _params())
  shardings = jaxprune.state_shardings(shapes, _params_shardings())
  assert jax.tree.structure(shardings) == jax.tree.structure(shapes)
  masks = jaxprune.pruning_state_shardings(shapes, _params_shardings()).masks
  assert _spec_tree(masks)['Dense_0']['kernel'] == P(None, 'model')
  # Every params-shaped leaf (moments, accumulators) is laid out like its param;
  # every scalar (counts, hyperparameters, thresholds) is replicated.
  flat_shapes = jax.tree.leaves(shapes)
  flat_shardings = jax.tree.leaves(shardings)
  assert len(flat_shapes) == len(flat_shardings)
  for shape, sharding in zip(flat_shapes, flat_shardings, strict=True):
    if shape.shape == (8, 16):
      assert sharding.spec == P(None, 'model')
    elif shape.shape == (16, 4):
      assert sharding.spec == P('data', None)
    elif shape.ndim == 0:
      assert sharding.spec == REPLICATED


def test_a_sharding_that_does_not_fit_a_leaf_leaves_it_replicated():
  # adafactor's factored statistics have the params' tree but other shapes.
  params = {'w': {'kernel': jnp.ones((64, 128))}}
  tx = optax.chain(optax.adafactor(1e-3, min_dim_size_to_factor=32), jaxprune.pruning(_hparams()))
  shapes = jax.eval_shape(tx.init, params)
  shardings = jaxprune.state_shardings(
    shapes, {'w': {'kernel': NamedSharding(MESH, P(None, 'model'))}}
  )
  for shape, sharding in zip(jax.tree.leaves(shapes), jax.tree.leaves(shardings), strict=True):
    expected = P(None, 'model') if shape.shape == (64, 128) else REPLICATED
    assert sharding.spec == expected, shape


def test_one_sharding_for_all_params():
  tx = optax.chain(optax.adam(1e-3), jaxprune.pruning(_hparams()))
  shapes = jax.eval_shape(tx.init, _params())
  rows = NamedSharding(MESH, P('data', None))
  shardings = jaxprune.state_shardings(shapes, rows)
  assert _spec_tree(shardings[1].masks) == {
    'Dense_0': {'kernel': P('data', None), 'bias': None},
    'Dense_1': {'kernel': P('data', None), 'bias': None},
  }
  # The moments of the 2-D kernels take it; the 1-D biases cannot and are replicated.
  assert _spec_tree(shardings[0][0].mu) == {
    'Dense_0': {'kernel': P('data', None), 'bias': REPLICATED},
    'Dense_1': {'kernel': P('data', None), 'bias': REPLICATED},
  }
  assert shardings[1].thresholds['Dense_0']['kernel'].spec == REPLICATED


def test_partition_specs_with_a_mesh():
  state = jaxprune.pruning(_hparams()).init(_params())
  shardings = jaxprune.state_shardings(state, _specs(), mesh=MESH)
  assert shardings.masks['Dense_0']['kernel'] == NamedSharding(MESH, P(None, 'model'))
  assert shardings.step == NamedSharding(MESH, P())


def test_partition_specs_without_a_mesh_is_an_error():
  state = jaxprune.pruning(_hparams()).init(_params())
  with pytest.raises(ValueError, match='mesh='):
    jaxprune.state_shardings(state, _specs())


def test_other_sharding_types_are_an_error():
  state = jaxprune.pruning(_hparams()).init(_params())
  single = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  with pytest.raises(TypeError, match='SingleDeviceSharding'):
    jaxprune.state_shardings(state, jax.tree.map(lambda _: single, _params()))


def test_pruning_state_shardings_needs_a_pruning_state():
  shapes = jax.eval_shape(optax.adam(1e-3).init, _params())
  with pytest.raises(ValueError, match='found 0'):
    jaxprune.pruning_state_shardings(shapes, _params_shardings())


def test_abstract_with_shardings_and_jit():
  tx = optax.chain(optax.adam(1e-3), jaxprune.pruning(_hparams()))
  params = _params()
  shapes = jax.eval_shape(tx.init, params)
  shardings = jaxprune.state_shardings(shapes, _params_shardings())
  abstract = jaxprune.abstract_with_shardings(shapes, shardings)
  for leaf, shape, sharding in zip(
    jax.tree.leaves(abstract), jax.tree.leaves(shapes), jax.tree.leaves(shardings), strict=True
  ):
    assert isinstance(leaf, jax.ShapeDtypeStruct)
    assert (leaf.shape, leaf.dtype, leaf.sharding) == (shape.shape, shape.dtype, sharding)
  # The shardings are accepted by jit as in_shardings and out_shardings.
  step = jax.jit(
    tx.update,
    in_shardings=(_params_shardings(), shardings, _params_shardings()),
    out_shardings=(_params_shardings(), shardings),
  )
  updates, state = step(params, tx.init(params), params)
  assert state[1].masks['Dense_0']['kernel'].sharding == shardings[1].masks['Dense_0']['kernel']
  expected_updates, expected_state = jax.jit(tx.update)(params, tx.init(params), params)
  for got, want in zip(
    jax.tree.leaves((updates, state)),
    jax.tree.leaves((expected_updates, expected_state)),
    strict=True,
  ):
    np.testing.assert_array_equal(got, want)
