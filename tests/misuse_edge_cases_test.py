"""Misuse and edge cases across the library that must not pass in silence: each gives the
right result or one line naming the fix."""

import re
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.experimental import sparse as jsparse
from oneshot_references import conv_patches, sparsegpt_reference

import jaxprune
import jaxprune.structured as jps
from jaxprune import oneshot


def _updates_at_0_10_20(**extra):
  text = (
    'begin_pruning_step=0,end_pruning_step=20,pruning_frequency=10,target_sparsity=0.5,'
    'sparsity_function_end_step=20,weight_name_regex=kernel,threshold_method=exact'
  )
  return jaxprune.parse_hparams(text, **extra) if extra else jaxprune.parse_hparams(text)


@pytest.mark.slow
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
  from jaxprune._transform import moved as _moved

  masks, params = [jnp.full((1, 1), kept)], [jnp.full((1, 1), value)]
  assert bool(jax.jit(_moved.any_moved)(masks, params)) is moved


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


def _depthwise_conv(channels=6, seed=0):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(4, 6, 6, channels)), jnp.float32)
  params = {'k': jnp.asarray(rng.normal(size=(3, 3, 1, channels)), jnp.float32)}

  def fn(p, x):
    return jax.lax.conv_general_dilated(
      x,
      p['k'],
      (1, 1),
      'SAME',
      dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
      feature_group_count=channels,
    )

  return fn, params, [x[:2], x[2:]]


@pytest.mark.parametrize('method', ['magnitude', 'wanda', 'sparsegpt'])
def test_every_method_reaches_50_percent_on_a_depthwise_3x3_conv(method):
  # 6 rows of 9 inputs: 50% is 27 weights, 4 or 5 a row (4 each would be 24: 44.4%).
  fn, params, batches = _depthwise_conv()
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    new, masks, report = oneshot.prune_with_report(
      fn, params, batches, method=method, sparsity=0.5, per_row=method == 'magnitude'
    )
  pruned = ~np.asarray(masks['k']).reshape(9, 6)
  assert int(pruned.sum()) == 27
  assert sorted(pruned.sum(axis=0).tolist()) == [4, 4, 4, 5, 5, 5]
  assert report.short == ()
  assert int(np.sum(np.asarray(new['k']) == 0)) == 27


def test_sparsegpt_on_a_depthwise_conv_gives_the_extra_weight_to_the_least_salient_groups():
  # By the numpy reference: each channel's Hessian from its own patches; the 3 channels
  # whose 5th-lowest w^2 H_jj is least prune 5 of 9, the others 4, each by Algorithm 1.
  fn, params, batches = _depthwise_conv()
  new, masks = oneshot.prune(fn, params, batches, method='sparsegpt', sparsity=0.5)
  x = np.concatenate([np.asarray(b) for b in batches])
  patches = conv_patches(x, (3, 3), 1, ((1, 1), (1, 1)), 1, 6)  # (6, tokens, 9)
  kernel = np.asarray(params['k'], np.float64).reshape(9, 6).T  # row c: channel c's 9
  hessians = [2 * p.T @ p / p.shape[0] for p in patches]
  fifth = [np.sort(kernel[c] ** 2 * np.diag(hessians[c]))[4] for c in range(6)]
  extra = set(np.argsort(fifth, kind='stable')[:3].tolist())
  for c in range(6):
    share = (5 if c in extra else 4) / 9
    want_w, want_mask = sparsegpt_reference(kernel[c : c + 1], hessians[c], share, None, 9, 0.01)
    np.testing.assert_array_equal(np.asarray(masks['k'])[..., 0, c].reshape(9), want_mask[0])
    np.testing.assert_allclose(
      np.asarray(new['k'])[..., 0, c].reshape(9), want_w[0], rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize('method', ['magnitude', 'wanda', 'sparsegpt', 'ria'])
def test_every_oneshot_method_refuses_a_nan_weight_naming_the_layer(method):
  rng = np.random.default_rng(0)
  head = rng.normal(size=(4, 2)).astype(np.float32)
  head[2, 1] = np.nan
  params = {'fc1': {'kernel': jnp.asarray(rng.normal(size=(8, 4)), jnp.float32)}}
  params['head'] = {'kernel': jnp.asarray(head)}
  batches = [jnp.asarray(rng.normal(size=(16, 8)), jnp.float32)]

  def fn(p, x):
    return (x @ p['fc1']['kernel']) @ p['head']['kernel']

  message = r"layer 'head/kernel' holds 1 NaN or Inf weight.*overrides=\{'head/kernel': None\}"
  with pytest.raises(ValueError, match=message):
    oneshot.prune(fn, params, batches, method=method, sparsity=0.5)
  # The way out it names: that layer dense, the other pruned.
  _, masks = oneshot.prune(
    fn, params, batches, method=method, sparsity=0.5, overrides={'head/kernel': None}
  )
  assert masks['head']['kernel'] is None
  assert int(jnp.sum(~masks['fc1']['kernel'])) == 16


@pytest.mark.parametrize(
  ('text', 'fix'),
  [
    ('weight_sparsity_map=[:0.999]', 'target_sparsity=0.999'),
    ('block_dims_map=[:4x4]', 'block_height=4,block_width=4'),
    ('nm_sparsity_map=[:2:4]', "nm_sparsity='2:4'"),
    ('layer_axes_map=[:1]', "'.*:1'"),
  ],
)
def test_a_map_entry_with_an_empty_regex_is_refused_naming_the_fix(text, fix):
  entry = text.split('[')[1].rstrip(']')
  with pytest.raises(ValueError, match='entry ' + re.escape(repr(entry)) + '.*' + re.escape(fix)):
    jaxprune.pruning(jaxprune.parse_hparams(text))


def test_pruning_inside_pruned_is_refused():
  inner = optax.chain(optax.adam(1e-3), jaxprune.pruning(target_sparsity=0.9))
  tx = jaxprune.pruned(inner, target_sparsity=0.5)
  with pytest.raises(ValueError, match=r'already holds a jaxprune\.pruning.*pruned twice'):
    tx.init({'dense': {'kernel': jnp.ones((4, 4))}})


@pytest.mark.parametrize(
  ('name', 'meant'),
  [
    ('sparsity', 'target_sparsity'),  # spelling alone suggested nm_sparsity
    ('amount', 'target_sparsity'),
    ('target', 'target_sparsity'),
    ('end_step', 'sparsity_function_end_step'),
    ('sparsity_map', 'weight_sparsity_map'),  # spelling alone suggested nm_sparsity_map
  ],
)
def test_other_libraries_field_names_suggest_ours(name, meant):
  with pytest.raises(ValueError, match=rf"unknown hyperparameter '{name}': did you mean '{meant}'"):
    jaxprune.pruning(**{name: 0.9})


@pytest.mark.parametrize('form', ['pruning', 'pruned'])
def test_grads_wrapped_in_params_are_named_with_the_fix(form):
  params = {'dense': {'kernel': jnp.ones((4, 4)), 'bias': jnp.ones(4)}}
  tx = {
    'pruning': lambda: optax.chain(optax.sgd(1e-3), jaxprune.pruning(target_sparsity=0.5)),
    'pruned': lambda: jaxprune.pruned(optax.adam(1e-3), target_sparsity=0.5),
  }[form]()
  state = tx.init(params)
  message = r"wrapped in \{'params': \.\.\.\}.*unwrap them \(grads\['params'\]\)"
  with pytest.raises(ValueError, match=message) as error:
    tx.update({'params': params}, state, params)
  assert 'init again' not in str(error.value) and 'PyTreeDef' not in str(error.value)


def test_params_given_to_init_wrapped_and_not_to_update_are_named():
  params = {'dense': {'kernel': jnp.ones((4, 4))}}
  tx = jaxprune.pruning(target_sparsity=0.5)
  state = tx.init({'params': params})
  with pytest.raises(ValueError, match=r"params given to init are wrapped in \{'params'"):
    tx.update(params, state, params)


def test_ste_with_nan_gradients_counts_its_skips_and_warns():
  from jaxprune import sparse

  params = {
    'a': {'kernel': jnp.arange(16.0).reshape(4, 4)},
    'b': {'kernel': jnp.arange(8.0).reshape(2, 4), 'bias': jnp.zeros(4)},
  }
  tx = sparse.ste(optax.sgd(0.1), sparsity=0.5)
  state = tx.init(params)
  nan_grads = jax.tree.map(lambda p: jnp.full_like(p, jnp.nan), params)
  update = jax.jit(tx.update)
  for _ in range(3):
    updates, state = update(nan_grads, state, params)
    params = optax.apply_updates(params, updates)
  # Each of 3 steps finds both kernels' dense weights NaN: 2 skips a step, masks as at init.
  assert int(state.nonfinite_skips) == 6
  with pytest.warns(UserWarning, match=r'6 leaf mask update\(s\) were skipped.*NaN'):
    masks = sparse.get_masks(state)
  assert bool(jnp.all(masks['a']['kernel'])) and bool(jnp.all(masks['b']['kernel']))


def test_ste_with_finite_gradients_stays_quiet():
  from jaxprune import sparse

  params = {'a': {'kernel': jnp.arange(16.0).reshape(4, 4)}}
  tx = sparse.ste(optax.sgd(0.1), sparsity=0.5)
  state = tx.init(params)
  _, state = jax.jit(tx.update)(jax.tree.map(jnp.ones_like, params), state, params)
  assert int(state.nonfinite_skips) == 0
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    assert int(jnp.sum(sparse.get_masks(state)['a']['kernel'])) == 8


class _CNN(nn.Module):
  """Four 3x3 convs of 8, 16, 16, 32 features and a head of 10 on 3 input channels."""

  @nn.compact
  def __call__(self, x):
    for features in (8, 16, 16, 32):
      x = nn.relu(nn.Conv(features, (3, 3))(x))
    return nn.Dense(10)(x.mean(axis=(1, 2)))


class _BNCNN(nn.Module):
  train: bool = False

  @nn.compact
  def __call__(self, x):
    for features in (8, 16):
      x = nn.Conv(features, (3, 3))(x)
      x = nn.relu(nn.BatchNorm(use_running_average=not self.train)(x))
    return nn.Dense(10)(x.mean(axis=(1, 2)))


class _Other(nn.Module):
  train: bool = False

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.BatchNorm(use_running_average=not self.train)(nn.Conv(8, (3, 3))(x)))
    return nn.Dense(10)(x.mean(axis=(1, 2)))


def _images(channels=3, seed=0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=(4, 8, 8, channels)), jnp.float32)


@pytest.fixture(scope='module')
def cnn():
  model = _CNN()
  return model, model.init(jax.random.key(0), _images())


@pytest.mark.slow
def test_a_structured_result_counts_feature_channels_not_spatial_axes(cnn):
  model, variables = cnn
  result = jps.prune(model, variables, _images(), ratio=0.5, progress=False)
  # By hand: the convs' 8 + 16 + 16 + 32 = 72 features are prunable, half of each goes
  # (36); the 3 input channels and the 10 logits are channels too, not prunable: 85. The
  # 3x3 kernels' spatial axes and the images' 8x8 positions are no channels.
  assert result.summary().splitlines()[4] == 'removed 36 of 72 prunable channels (85 in all)'
  assert 'channels removed from 4 of 6 channel groups' in repr(result)


def test_bn_recalibration_is_advised_only_for_a_model_with_batch_norm(cnn):
  model, variables = cnn
  plain = jps.prune(model, variables, _images(), ratio=0.5, progress=False)
  assert plain.dense_distance.large
  assert 'BatchNorm' not in plain.summary() and 'recalibrate' not in repr(plain)
  bn = _BNCNN()
  bn_variables = bn.init(jax.random.key(0), _images())
  with_bn = jps.prune(bn, bn_variables, _images(), ratio=0.5, progress=False)
  assert with_bn.dense_distance.large
  assert 'Calibration(batches, recalibrate_bn=True)' in with_bn.summary()
  assert '(a large change: fine-tune or recalibrate)' in repr(with_bn)


def test_structured_density_without_masks_on_dense_variables_is_refused(cnn):
  model, variables = cnn
  with pytest.raises(ValueError, match=r"importance='density'.*masks=jaxprune\.get_masks"):
    jps.prune(model, variables, _images(), ratio=0.5, importance='density', progress=False)


def test_structured_recalibrate_bn_must_be_a_bool():
  with pytest.raises(TypeError, match=r"recalibrate_bn='yes': give True or False"):
    jps.Calibration([_images()], recalibrate_bn='yes')


def test_structured_train_model_of_another_architecture_is_refused():
  model = _BNCNN()
  variables = model.init(jax.random.key(0), _images())
  calibration = jps.Calibration([_images(seed=1)], recalibrate_bn=True)
  other = jps.LinenOptions(train_model=_Other(train=True), train_kwargs={})
  with pytest.raises(ValueError, match=r'train_model \(_Other\) has other variables.*_BNCNN'):
    jps.prune(model, variables, _images(), ratio=0.5, calibration=calibration, linen=other)
  with pytest.raises(ValueError, match=r'train_model is read only when re-calibrating'):
    jps.prune(model, variables, _images(), ratio=0.5, linen=other)
  same = jps.LinenOptions(train_model=_BNCNN(train=True), train_kwargs={})
  result = jps.prune(
    model, variables, _images(), ratio=0.5, calibration=calibration, linen=same, progress=False
  )
  assert result.variables['batch_stats']['BatchNorm_0']['mean'].shape == (4,)


def test_structured_taylor_batches_of_another_shape_name_the_batches(cnn):
  model, variables = cnn
  calibration = jps.Calibration([_images(channels=5)], loss_fn=lambda out, batch: out.mean())
  with pytest.raises(ValueError, match=r'Calibration\.batches: the model inputs of a batch'):
    jps.prune(model, variables, _images(), ratio=0.5, importance='taylor', calibration=calibration)


def test_structured_prune_of_model_apply_with_bare_params_names_the_fix(cnn):
  model, variables = cnn
  with pytest.raises(TypeError, match=r"prune\(model\.apply, \{'params': params\}, x"):
    jps.prune(model.apply, variables['params'], _images(), ratio=0.5)


class _ExportCNN(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(4, (3, 3), name='conv_a')(x))
    x = nn.relu(nn.Dense(8, name='fc1')(x.mean((1, 2))))
    return nn.Dense(3, name='head')(x)


def _export_cnn():
  model = _ExportCNN()
  x = jax.random.normal(jax.random.key(1), (2, 6, 6, 2))
  params = model.init(jax.random.key(0), x)['params']
  masks = jax.tree.map(
    lambda w: jnp.abs(w) > jnp.median(jnp.abs(w)) if w.ndim >= 2 else None, params
  )
  return (lambda p, x: model.apply({'params': p}, x)), params, masks, x


@pytest.mark.slow
def test_sparse_outputs_of_a_cnn_run_its_conv_kernel_dense_and_say_so_once():
  fn, params, masks, x = _export_cnn()
  with pytest.warns(
    UserWarning, match=r'no rule for a convolution.*run dense: conv_a/kernel \(stored'
  ):
    assert jaxprune.check_sparse_outputs(fn, params, masks, x) <= 1e-5
  sparse_params = jaxprune.to_bcoo(params, masks)  # the conv kernel too: storage only
  assert isinstance(sparse_params['conv_a']['kernel'], jsparse.BCOO)
  with warnings.catch_warnings():
    warnings.simplefilter('error')  # said once
    out = jax.jit(jaxprune.sparse_apply(fn))(sparse_params, x)
  np.testing.assert_allclose(out, fn(jaxprune.strip(params, masks), x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('function', ['to_bcoo', 'size_report', 'strip', 'check_sparse_outputs'])
def test_an_export_names_regex_that_matches_no_leaf_is_refused(function):
  fn, params, masks, x = _export_cnn()
  call = {
    'to_bcoo': lambda: jaxprune.to_bcoo(params, masks, names='Dense'),
    'size_report': lambda: jaxprune.size_report(params, masks, names='Dense'),
    'strip': lambda: jaxprune.strip(params, masks, names='Dense'),
    'check_sparse_outputs': lambda: jaxprune.check_sparse_outputs(
      fn, params, masks, x, names='Dense'
    ),
  }[function]
  with pytest.raises(ValueError, match=rf"{function}: names='Dense' matches none.*'fc1/kernel'"):
    call()


def test_sparse_apply_names_restricts_what_runs_sparse():
  fn, params, masks, x = _export_cnn()
  sparse_params = jaxprune.to_bcoo(params, masks, names='fc1|head')
  with pytest.raises(ValueError, match=r"sparse_apply: names='Dense' matches none"):
    jaxprune.sparse_apply(fn, names='Dense')(sparse_params, x)
  out = jaxprune.sparse_apply(fn, names='head')(sparse_params, x)
  np.testing.assert_allclose(out, fn(jaxprune.strip(params, masks), x), rtol=1e-5, atol=1e-6)


def test_export_names_choose_the_leaves_of_every_function():
  _, params, masks, _ = _export_cnn()
  report = jaxprune.size_report(params, masks, names='fc1|head')
  stored = {leaf.name: leaf.sparse for leaf in report.leaves}
  assert stored == {
    'conv_a/bias': False,
    'conv_a/kernel': False,
    'fc1/bias': False,
    'fc1/kernel': True,
    'head/bias': False,
    'head/kernel': True,
  }
  assert '**' not in report.table() and '| total ' in report.table()
  stripped = jaxprune.strip(params, masks, names='fc1')
  np.testing.assert_array_equal(stripped['head']['kernel'], params['head']['kernel'])
  # fc1's 32 weights: the 16 at or below the median of |w| are zeroed.
  assert int(jnp.sum(stripped['fc1']['kernel'] == 0)) == 16
