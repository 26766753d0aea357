"""`prune` on plain JAX functions `fn(variables, *args)`: its third adapter, after Linen, NNX."""

import functools

import equinox as eqx
import flax.linen as nn
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxprune.structured as jps


def _mlp(params, x):
  h = jax.nn.relu(x @ params['w1'] + params['b1'])
  return h @ params['w2']


def _mlp_params():
  k1, k2 = jax.random.split(jax.random.key(0))
  return {
    'w1': jax.random.normal(k1, (6, 16)),
    'b1': jnp.linspace(-1, 1, 16),
    'w2': jax.random.normal(k2, (16, 3)),
  }


def test_a_function_is_pruned_as_trace_select_apply_plan_prune_it():
  params, x = _mlp_params(), jax.random.normal(jax.random.key(1), (4, 6))
  result = jps.prune(_mlp, x, variables=params, ratio=0.5, progress=False)

  graph = jps.trace(_mlp, params, x)
  plan = jps.select(graph, params, ratio=0.5)
  expected, _ = jps.apply_plan(graph, params, plan)
  assert result.plan.removed.keys() == plan.removed.keys()
  for gid, removed in plan.removed.items():
    np.testing.assert_array_equal(result.plan.removed[gid], removed)
  jax.tree.map(np.testing.assert_array_equal, result.variables, expected)
  assert result.variables['w1'].shape == (6, 8) and result.variables['w2'].shape == (8, 3)
  # What users run is the pruned callable: at any batch size, equal to the zeroed dense model.
  assert result.model is result.pruned_fn
  assert result.check.ok and result.model_check.ok
  zeroed = jps.zero_removed(graph, params, plan)
  np.testing.assert_allclose(
    result.model(result.variables, x[:1]), _mlp(zeroed, x[:1]), rtol=1e-5, atol=1e-6
  )
  assert result.flops_after == pytest.approx(result.flops_before / 2)
  assert 'fewer' in result.summary()


@pytest.mark.slow
def test_a_haiku_model_to_a_flops_target_with_taylor_importance():
  net = hk.transform_with_state(
    lambda x, is_training: hk.nets.MobileNetV1(strides=(1, 2), channels=(16, 32), num_classes=10)(
      x, is_training
    )
  )
  x = jax.random.normal(jax.random.key(1), (4, 16, 16, 3))
  params, state = net.init(jax.random.key(0), x, is_training=True)  # makes the BN averages
  variables = {'params': params, 'state': state}
  fn = lambda v, x: net.apply(v['params'], v['state'], None, x, is_training=False)[0]
  labels = jnp.arange(4) % 10
  loss = lambda logits, batch: optax.softmax_cross_entropy_with_integer_labels(
    logits, batch[1]
  ).mean()

  result = jps.prune(
    fn,
    x,
    variables=variables,
    flops_target=0.6,
    importance='taylor',
    calibration=jps.Calibration([(x, labels)], loss_fn=loss),
    progress=False,
  )
  assert result.flops_after <= 0.6 * result.flops_before
  assert result.check.ok and result.model_check.ok
  assert result.model(result.variables, x[:1]).shape == (1, 10)
  kept = {
    k: v.shape[-1]
    for k, v in jax.tree_util.tree_leaves_with_path(result.variables)
    for k in [jax.tree_util.keystr(k)]
    if k.endswith("['w']")
  }
  assert min(kept.values()) < 32  # some conv lost channels


def test_an_equinox_model_through_partition():
  mlp = eqx.nn.MLP(16, 4, width_size=32, depth=2, key=jax.random.key(0))
  params, static = eqx.partition(mlp, eqx.is_array)
  fn = lambda params, x: jax.vmap(eqx.combine(params, static))(x)
  x = jax.random.normal(jax.random.key(1), (8, 16))
  result = jps.prune(fn, x, variables=params, ratio=0.25, progress=False)
  # A quarter of each hidden layer's 32 units goes: 24 stay in both.
  shapes = [layer.weight.shape for layer in result.variables.layers]
  assert shapes == [(24, 16), (24, 24), (4, 24)]
  # The smaller model computes what the dense one does with the removed units zeroed.
  zeroed = jps.zero_removed(jps.trace(fn, params, x), params, result.plan)
  np.testing.assert_allclose(result.model(result.variables, x), fn(zeroed, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(linen=jps.LinenOptions(apply_kwargs={'train': False})), 'apply_kwargs apply to Flax'),
    (
      dict(linen=jps.LinenOptions(train_model=nn.Dense(3), train_kwargs={})),
      'train_model, train_kwargs apply to Flax',
    ),
    (dict(calibration=jps.Calibration([1], recalibrate_bn=True)), 'recalibrate_bn apply to Flax'),
  ],
)
def test_flax_only_arguments_are_refused_for_a_function(kwargs, match):
  with pytest.raises(ValueError, match=match):
    jps.prune(_mlp, jnp.ones((2, 6)), variables=_mlp_params(), ratio=0.5, **kwargs)


_CAL = 'calibration=jaxprune.structured.Calibration'
_LINEN = 'linen=jaxprune.structured.LinenOptions'


@pytest.mark.parametrize(
  'kwargs, message',
  [
    (dict(calibration_batches=[1]), f'calibration_batches= moved: pass {_CAL}(batches=...)'),
    (dict(loss_fn=len), f'loss_fn= moved: pass {_CAL}(batches, loss_fn=...)'),
    (dict(inputs=len), f'inputs= moved: pass {_CAL}(batches, inputs=...)'),
    (
      dict(recalibrate_bn=True),
      f'recalibrate_bn= moved: pass {_CAL}(batches, recalibrate_bn=True)',
    ),
    (dict(apply_kwargs={}), f'apply_kwargs= moved: pass {_LINEN}(apply_kwargs=...)'),
    (
      dict(train_model=None, train_kwargs={}),
      f'train_kwargs=, train_model= moved: pass {_LINEN}(train_kwargs=..., train_model=...)',
    ),
    (
      dict(loss_fn=len, apply_kwargs={}, calibration_batches=[1]),
      f'calibration_batches=, loss_fn= moved: pass {_CAL}(batches=..., loss_fn=...); '
      f'apply_kwargs= moved: pass {_LINEN}(apply_kwargs=...)',
    ),
  ],
)
def test_the_keywords_that_moved_name_their_new_form_in_one_line(kwargs, message):
  with pytest.raises(TypeError) as error:
    jps.prune(_mlp, jnp.ones((2, 6)), variables=_mlp_params(), ratio=0.5, **kwargs)
  assert str(error.value) == f'prune: {message}'


def test_the_groups_are_checked_before_anything_is_traced():
  x = jnp.ones((2, 6))
  with pytest.raises(TypeError, match='calibration: give a jaxprune.structured.Calibration, got'):
    jps.prune(_mlp, x, variables=_mlp_params(), ratio=0.5, calibration={'batches': [x]})
  with pytest.raises(TypeError, match='linen: give a jaxprune.structured.LinenOptions, got dict'):
    jps.prune(_mlp, x, variables=_mlp_params(), ratio=0.5, linen={})
  with pytest.raises(TypeError, match='loss_fn must be callable'):
    jps.prune(
      _mlp,
      x,
      variables=_mlp_params(),
      ratio=0.5,
      importance='taylor',
      calibration=jps.Calibration([x], loss_fn='mse'),
    )
  with pytest.raises(ValueError, match='Calibration.batches is empty'):
    loss = lambda out, batch: out.sum()
    calibration = jps.Calibration([], loss_fn=loss)
    jps.prune(
      _mlp, x, variables=_mlp_params(), ratio=0.5, importance='taylor', calibration=calibration
    )


def test_calibration_batches_may_be_any_iterable_and_are_read_once():
  """A generator of batches is read into a list before anything runs, as the docs say."""
  params, x = _mlp_params(), jax.random.normal(jax.random.key(1), (4, 6))
  loss = lambda out, batch: jnp.sum(out**2)
  from_list = jps.prune(
    _mlp,
    x,
    variables=params,
    ratio=0.5,
    importance='taylor',
    calibration=jps.Calibration([x, 2 * x], loss_fn=loss),
    progress=False,
  )
  from_generator = jps.prune(
    _mlp,
    x,
    variables=params,
    ratio=0.5,
    importance='taylor',
    calibration=jps.Calibration((b for b in (x, 2 * x)), loss_fn=loss),
    progress=False,
  )
  assert from_generator.plan.removed.keys() == from_list.plan.removed.keys()
  for gid, removed in from_list.plan.removed.items():
    np.testing.assert_array_equal(from_generator.plan.removed[gid], removed)


def test_what_prune_cannot_take():
  with pytest.raises(TypeError, match='a Flax Linen or NNX module or a function'):
    jps.prune('mlp', jnp.ones((2, 6)), variables=_mlp_params(), ratio=0.5)
  with pytest.raises(ValueError, match='pass variables=... with a function'):
    jps.prune(_mlp, jnp.ones((2, 6)), ratio=0.5)
  with pytest.raises(ValueError, match='pass variables=... with a partial'):
    jps.prune(functools.partial(_mlp), jnp.ones((2, 6)), ratio=0.5)


def test_a_pruned_linen_result_prints_in_one_line_and_its_model_applies():
  """`print(result)` is one line (the fields hold whole models and graphs), and
  `result.model.apply(result.variables, x)` runs the module at the pruned sizes."""

  class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.relu(nn.Conv(16, (3, 3))(x))
      x = nn.relu(nn.Conv(32, (3, 3))(x))
      return nn.Dense(10)(x.mean((1, 2)))

  model, x = CNN(), jnp.ones((2, 8, 8, 3))
  variables = model.init(jax.random.key(0), x)
  result = jps.prune(model, x, variables=variables, ratio=0.5)
  text = repr(result)
  assert '\n' not in text and len(text) < 450, text
  assert text.startswith('PruneResult(channels removed from ') and 'FLOPs' in text
  out = result.model.apply(result.variables, x)
  np.testing.assert_array_equal(out, result.apply(result.variables, x))
  assert result.model.module is model


def test_variables_may_come_first_as_in_model_apply():
  """`prune(model, variables, x)` is `prune(model, x, variables=variables)`."""
  model = nn.Sequential([nn.Dense(32), nn.relu, nn.Dense(8)])
  x = jnp.ones((4, 12))
  variables = model.init(jax.random.key(0), x)
  a = jps.prune(model, variables, x, ratio=0.5)
  b = jps.prune(model, x, variables=variables, ratio=0.5)
  for u, v in zip(jax.tree.leaves(a.variables), jax.tree.leaves(b.variables), strict=True):
    np.testing.assert_array_equal(u, v)
  assert a.variables['params']['layers_0']['kernel'].shape == (12, 16)
