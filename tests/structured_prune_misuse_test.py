"""First guesses at `jaxprune.structured.prune` answered with the fix: one line
that names the value and the call that works, or a result where the intent is plain."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxprune.structured as jps


class BnCNN(nn.Module):
  @nn.compact
  def __call__(self, x, train=False):
    x = nn.Conv(8, (3, 3), name='conv')(x)
    x = nn.relu(nn.BatchNorm(use_running_average=not train, name='bn')(x))
    return nn.Dense(4, name='head')(x.mean((1, 2)))


class CNN(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(8, (3, 3), name='conv')(x))
    return nn.Dense(4, name='head')(x.mean((1, 2)))


X = jax.random.normal(jax.random.key(1), (4, 6, 6, 3))


@pytest.fixture(scope='module')
def cnn():
  return CNN(), CNN().init(jax.random.key(0), X)


@pytest.fixture(scope='module')
def bn_cnn():
  return BnCNN(), BnCNN().init(jax.random.key(0), X)


def _one_line(info):
  text = str(info.value)
  assert '\n' not in text, text
  return text


def test_flax_params_without_the_params_collection_say_wrap_them(cnn):
  model, variables = cnn
  with pytest.raises(TypeError, match=r"no 'params' collection \(their keys: 'conv', 'head'\)"):
    jps.prune(model, variables['params'], X, ratio=0.5)
  with pytest.raises(TypeError) as info:
    jps.prune(model, variables['params'], X, ratio=0.5)
  assert "prune(model, {'params': params}, x, ...)" in _one_line(info)


def test_inputs_before_the_variables_say_the_variables_come_first(cnn):
  model, variables = cnn
  with pytest.raises(TypeError) as info:
    jps.prune(model, X, variables, ratio=0.5)
  text = _one_line(info)
  assert 'got an array (float32[4, 6, 6, 3]) where the variables go' in text
  assert 'prune(model, variables, x, ...)' in text


@pytest.mark.parametrize('keyword', ['sparsity', 'target_sparsity'])
def test_a_sparsity_keyword_names_ratio_and_flops_target(cnn, keyword):
  model, variables = cnn
  with pytest.raises(TypeError) as info:
    jps.prune(model, variables, X, **{keyword: 0.5})
  text = _one_line(info)
  assert f'no keyword {keyword}=' in text and 'ratio=' in text and 'flops_target=' in text


def test_a_misspelt_keyword_names_the_one_meant(cnn):
  model, variables = cnn
  with pytest.raises(TypeError, match=r'no keyword raito=; did you mean ratio=\?'):
    jps.prune(model, variables, X, raito=0.5)


def test_calibration_of_one_array_asks_for_a_list():
  with pytest.raises(TypeError) as info:
    jps.Calibration(X, recalibrate_bn=True)
  text = _one_line(info)
  assert 'one array of shape (4, 6, 6, 3)' in text and 'Calibration([x])' in text
  assert jps.Calibration([X]).batches[0] is X


def test_params_without_batch_stats_name_the_missing_collection(bn_cnn):
  model, variables = bn_cnn
  with pytest.raises(ValueError) as info:
    jps.prune(model, {'params': variables['params']}, X, ratio=0.5)
  text = _one_line(info)
  assert "the variables have 'params', and BnCNN also reads 'batch_stats'" in text
  assert 'model.init(key, x)' in text


def test_inputs_with_the_wrong_channels_say_the_inputs_do_not_fit(cnn):
  model, variables = cnn
  with pytest.raises(ValueError) as info:
    jps.prune(model, variables, jnp.ones((4, 6, 6, 1)), ratio=0.5)
  text = _one_line(info)
  assert 'the example inputs (float32[4, 6, 6, 1]) do not fit the variables' in text
  assert '"kernel" in "/conv"' in text and 'https://' not in text


def test_a_loss_fn_that_raises_is_named_with_what_it_was_given(cnn):
  model, variables = cnn
  labels = jnp.zeros(4, jnp.int32)

  def loss_fn(outputs, batch):
    return outputs[batch['labels']]  # the batch is a tuple

  calibration = jps.Calibration([(X, labels)], loss_fn=loss_fn)
  with pytest.raises(ValueError) as info:
    jps.prune(model, variables, X, ratio=0.5, importance='taylor', calibration=calibration)
  text = _one_line(info)
  assert text.startswith('Calibration.loss_fn(outputs, batch) raised TypeError: ')
  assert 'model outputs (float32[4, 4])' in text
  assert 'batch as given (float32[4, 6, 6, 3], int32[4])' in text
  not_scalar = jps.Calibration([(X, labels)], loss_fn=lambda outputs, batch: outputs)
  with pytest.raises(ValueError, match=r'returned an array of shape \(4, 4\); return a scalar'):
    jps.prune(model, variables, X, ratio=0.5, importance='taylor', calibration=not_scalar)


@pytest.mark.parametrize(
  'options, match',
  [
    (dict(train_model=3), r'LinenOptions.train_model: give the Linen module in train mode'),
    (dict(train_kwargs=True), r'LinenOptions.train_kwargs: give a dict of keyword arguments'),
  ],
)
def test_linen_options_of_the_wrong_kind_are_named(options, match):
  with pytest.raises(TypeError, match=match) as info:
    jps.LinenOptions(**options)
  _one_line(info)


def test_masks_are_read_only_by_density_and_must_be_masks(cnn):
  model, variables = cnn
  with pytest.raises(ValueError, match=r"masks= is read only by importance='density'"):
    jps.prune(model, variables, X, ratio=0.5, masks={'conv': {'kernel': np.ones((3, 3, 3, 8))}})
  with pytest.raises(TypeError, match=r"masks: give the pytree of boolean masks .* got str 'abc'"):
    jps.prune(model, variables, X, ratio=0.5, importance='density', masks='abc')
  with pytest.raises(ValueError, match=r"none of the masks' names \(dense/kernel\)"):
    jps.prune(
      model, variables, X, ratio=0.5, importance='density', masks={'dense': {'kernel': np.ones(3)}}
    )
  # Masks that fit: the channels they already removed go first.
  masks = jax.tree.map(lambda x: np.ones(x.shape, bool), variables['params'])
  masks['conv']['kernel'][..., :4] = False
  result = jps.prune(
    model, variables, X, ratio=0.5, importance='density', masks=masks, progress=False
  )
  (part,) = result.graph.leaf_axes['params/conv/kernel'][3]
  assert result.plan.removed[part.group_id].tolist() == [0, 1, 2, 3]


def test_batchnorm_recalibration_names_a_nan_batch_and_averages_the_others(bn_cnn):
  model, variables = bn_cnn
  batches = [X, X.at[0, 0, 0, 0].set(jnp.nan), 2 * X + 1]
  with pytest.warns(UserWarning, match=r'1 of 3 calibration batches give NaN or Inf') as record:
    result = jps.prune(
      model,
      variables,
      X,
      ratio=0.5,
      calibration=jps.Calibration(batches, recalibrate_bn=True),
      progress=False,
    )
  (message,) = [str(w.message) for w in record if 'NaN or Inf' in str(w.message)]
  assert 'batch 1 (bn/mean, bn/var)' in message
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    clean = jps.prune(
      model,
      variables,
      X,
      ratio=0.5,
      calibration=jps.Calibration([batches[0], batches[2]], recalibrate_bn=True),
      progress=False,
    )
  stats = result.variables['batch_stats']['bn']
  np.testing.assert_allclose(stats['mean'], clean.variables['batch_stats']['bn']['mean'], 1e-6)
  np.testing.assert_allclose(stats['var'], clean.variables['batch_stats']['bn']['var'], 1e-6)
  # By hand: BatchNorm's batch mean is the conv output's mean per channel; the new running
  # mean is its average over the two finite batches, at the kept channels.
  conv = nn.Conv(8, (3, 3)).bind({'params': variables['params']['conv']})
  means = np.mean([np.asarray(conv(b)).mean((0, 1, 2)) for b in (batches[0], batches[2])], 0)
  (part,) = result.graph.leaf_axes['params/conv/kernel'][3]
  kept = result.plan.kept(part.group_id)
  np.testing.assert_allclose(stats['mean'], means[kept], rtol=1e-5, atol=1e-6)
