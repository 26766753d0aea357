"""A structured result states how far it is from the dense model, not only that it equals
the masked one (the dense model with the removed channels zeroed).

On a small CNN trained on scikit-learn's digits, one-shot pruning passes the exactness
check while changing many predictions; the result must say so, with the top-1 agreement
and relative output error worked out here in numpy from the two models' logits, and say
what to do. Removing channels that are already dead changes nothing, and says nothing.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from sklearn.datasets import load_digits

import jaxprune
import jaxprune.channels
import jaxprune.structured as jps
from jaxprune.channels import ChannelRule
from jaxprune_train import _channels


class DigitsCNN(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(16, (3, 3), strides=2, name='conv1')(x))
    x = nn.relu(nn.Conv(32, (3, 3), name='conv2')(x))
    return nn.Dense(10, name='head')(x.mean((1, 2)))


def train_digits_cnn():
  """(model, variables, test images, test labels): 200 Adam steps of batch 64 on 1400
  digits (8x8); about 90% on the other 397. (A jitted step in a Python loop: on CPU a
  `lax.scan` of the same steps runs ten times slower.)"""
  digits = load_digits()
  x = (digits.images[..., None] / 16.0).astype(np.float32)
  y = digits.target
  model = DigitsCNN()
  opt = optax.adam(1e-2)
  x_train, y_train = jnp.asarray(x[:1400]), jnp.asarray(y[:1400])

  @jax.jit
  def step(variables, state, batch):
    loss = lambda v: optax.softmax_cross_entropy_with_integer_labels(
      model.apply(v, x_train[batch]), y_train[batch]
    ).mean()
    updates, state = opt.update(jax.grad(loss)(variables), state)
    return optax.apply_updates(variables, updates), state

  variables = model.init(jax.random.key(0), x[:2])
  state = opt.init(variables)
  for batch in np.random.default_rng(0).integers(0, 1400, (200, 64)):
    variables, state = step(variables, state, batch)
  return model, variables, x[1400:], y[1400:]


@pytest.fixture(scope='module')
def trained():
  return train_digits_cnn()


def _numpy_distance(dense, pruned):
  dense, pruned = np.asarray(dense, np.float64), np.asarray(pruned, np.float64)
  agreement = np.mean(dense.argmax(-1) == pruned.argmax(-1))
  return agreement, np.linalg.norm(pruned - dense) / np.linalg.norm(dense)


@pytest.mark.slow
def test_a_pruned_trained_cnn_states_its_distance_from_the_dense_model(trained):
  model, variables, x, y = trained
  dense = model.apply(variables, x)
  assert np.mean(dense.argmax(-1) == y) > 0.8  # trained
  result = jps.prune(model, variables, x, ratio=0.5, progress=False)
  pruned = result.apply(result.variables, x)
  agreement, rel_error = _numpy_distance(dense, pruned)
  assert agreement < 0.9 and rel_error > 0.3  # one-shot pruning changed the model a lot
  assert result.check.ok  # while the exactness check passes
  distance = result.dense_distance
  assert distance.agreement == pytest.approx(agreement, abs=1e-9)
  assert distance.rel_error == pytest.approx(rel_error, rel=1e-4)
  assert distance.examples == len(x) and distance.large
  text, summary = repr(result), result.summary()
  assert '\n' not in text
  assert (
    f'top-1 agreement {agreement:.1%}' in text and f'top-1 agreement {agreement:.1%}' in summary
  )
  assert f'relative output error {rel_error:.2g}' in summary
  assert 'the masked model (the dense model with the removed channels zeroed): passed' in summary
  assert f'vs the dense model on the example inputs ({len(x)} examples)' in summary
  assert 'fine-tuning is expected' in summary
  assert 'docs/guides/structured.md#after-pruning-fine-tune-or-recalibrate' in summary
  # No BatchNorm in this CNN: no statistics to re-estimate, so no such advice.
  assert 'recalibrate_bn' not in summary and 'BatchNorm' not in summary
  assert '(a large change: fine-tune)' in text


def test_removing_dead_channels_is_no_change_and_says_none(trained):
  model, variables, x, _ = trained
  # Half of conv1's filters, zeroed with their biases and the conv2 rows that read them,
  # are dead: their L2 score is 0, the plan removes exactly them, and the pruned model
  # is the dense one.
  params = jax.tree.map(np.array, variables)['params']
  params['conv1']['kernel'][..., ::2] = 0
  params['conv1']['bias'][::2] = 0
  params['conv2']['kernel'][:, :, ::2] = 0
  dead = {'params': params}
  batches = [(x[:200], None), (x[200:], None)]
  result = jps.prune(
    model,
    dead,
    x,
    ratio=0.5,
    constraint=jps.Constraint(locked=('head',)),  # conv2's filters (read by the head) stay
    calibration=jps.Calibration(batches),
    progress=False,
  )
  assert result.variables['params']['conv1']['kernel'].shape[-1] == 8
  distance = result.dense_distance
  assert distance.agreement == 1.0 and distance.rel_error < 1e-5 and not distance.large
  assert distance.inputs == '2 calibration batches' and distance.examples == len(x)
  summary = result.summary()
  assert (
    f'vs the dense model on 2 calibration batches ({len(x)} examples): top-1 agreement 100.0%'
    in summary
  )
  assert 'expected' not in summary and 'recalibrate' not in repr(result)


def test_a_function_whose_output_is_not_logits_reports_the_error_alone():
  k = jax.random.split(jax.random.key(0), 3)
  params = {'w1': jax.random.normal(k[0], (6, 8)), 'w2': jax.random.normal(k[1], (8, 1))}
  fn = lambda p, x: (jnp.tanh(x @ p['w1']) @ p['w2'])[:, 0]  # one value per example
  x = jax.random.normal(k[2], (16, 6))
  result = jps.prune(fn, params, x, ratio=0.5, constraint=jps.Constraint(round_to=1))
  dense, pruned = fn(params, x), result.pruned_fn(result.variables, x)
  rel_error = np.linalg.norm(pruned - dense) / np.linalg.norm(dense)
  assert result.dense_distance.agreement is None
  assert result.dense_distance.rel_error == pytest.approx(float(rel_error), rel=1e-4)
  assert 'top-1' not in result.summary() and 'relative output error' in result.summary()
  assert jps.prune(fn, params, x, ratio=0.5, check=False).dense_distance is None


def _channel_pruned(model, variables, x):
  """A `ChannelRule` over `model` traced at `x` and the optimizer state of one mask
  update at 50% of every group, with the params it masked (as the main job's training
  leaves them)."""
  graph = jps.trace(model.apply, variables, x)
  rule = ChannelRule(graph, constraint=jps.Constraint(round_to=1))
  hparams = jaxprune.get_pruning_hparams()
  hparams.update({'pruning_frequency': 1, 'threshold_method': 'exact'})
  tx = optax.chain(
    optax.sgd(0.0), jaxprune.pruning(hparams, sparsity_fn=lambda t: 0.5, mask_rule=rule)
  )
  params = variables['params']
  state = tx.init(params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  for _ in range(2):  # step 0 trains, step 1 updates the masks
    updates, state = tx.update(zeros, state, params)
    params = optax.apply_updates(params, updates)
  return rule, params, state


@pytest.mark.slow
def test_channel_shrink_and_the_main_jobs_report_state_the_distance(trained):
  model, variables, x, y = trained
  rule, _, state = _channel_pruned(model, variables, x)
  # Shrinking the weights as trained before the masks (not zero where masked): exact
  # against the masked model, and as far from the dense one as numpy says.
  shrunk = jaxprune.channels.shrink(rule, variables, state, x)
  agreement, rel_error = _numpy_distance(
    model.apply(variables, x), shrunk.pruned_fn(shrunk.variables, x)
  )
  assert agreement < 0.95 and shrunk.check.ok
  assert shrunk.dense_distance.agreement == pytest.approx(agreement, abs=1e-9)
  assert shrunk.dense_distance.rel_error == pytest.approx(rel_error, rel=1e-4)
  summary = shrunk.summary()
  assert 'exactness check against the masked model' in summary
  assert f'vs the dense model on the example inputs ({len(x)} examples): top-1 agreement' in summary
  assert 'fine-tuning is expected' in summary and 'recalibrate_bn' not in summary  # no BN
  # The main job (its rule traced at two images) shrinks the masked weights it trained:
  # the artifact is the trained model.
  rule, masked, state = _channel_pruned(model, variables, jnp.zeros((2, 8, 8, 1)))
  result = _channels.finish(rule, model, masked, state, x, y, None, timing_rounds=1)
  assert result.vs_trained.agreement == 1.0 and result.vs_trained.rel_error < 1e-5
  line = result.lines()[-1]
  assert line.startswith(
    f'shrunk model vs the dense model on the test split ({len(x)} examples): '
    'top-1 agreement 100.0%, relative output error '
  )
  assert 'expected' not in line


def test_nan_outputs_are_infinitely_far_and_integer_outputs_are_not_compared():
  from jaxprune.structured._shared import dense_distance

  logits = np.array([[1.0, 2.0], [3.0, 0.0]])
  broken = dense_distance([logits], [np.full((2, 2), np.nan)], 'the example inputs')
  assert broken.rel_error == float('inf') and broken.large
  halved = dense_distance([logits], [logits / 2], 'the example inputs')
  # By hand: ||l/2 - l|| / ||l|| = 1/2; the largest logit stays where it was.
  assert halved.rel_error == pytest.approx(0.5) and halved.agreement == 1.0 and halved.large
  labels = dense_distance([np.arange(3)], [np.arange(3)], 'the example inputs')
  assert np.isnan(labels.rel_error) and labels.agreement is None and not labels.large
  assert labels.line().endswith(
    '(3 examples): no float output of the same shape in both to compare'
  )
