"""End to end: Flax Linen and NNX MLPs trained on sklearn's digits with the pruning transform."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from sklearn.datasets import load_digits

import jaxprune

F32 = np.float32
NBINS = 256
# Masks update every 10 steps; the schedule ends at 150 and the last of the 161
# steps (step 160) is a mask update at the target, so the final params are the
# masked result of that update.
STEPS = 161
SCHEDULE = dict(pruning_frequency=10, sparsity_function_end_step=150, nbins=NBINS)


def _digits():
  x, y = load_digits(return_X_y=True)
  return jnp.asarray(x / 16.0, jnp.float32), jnp.asarray(y, jnp.int32)


def _check_leaf(name, weights, mask, threshold, target):
  """Pruned weights are exactly 0 and the sparsity is in [target - one bin's share, target].

  One bin's share: the fraction of weights in the first histogram bin whose CDF
  reaches the target; its lower edge is the threshold, thr = first / nbins * max.
  """
  weights, mask = np.asarray(weights), np.asarray(mask)
  np.testing.assert_array_equal(weights[~mask], 0.0, err_msg=name)
  assert np.all(weights[mask] != 0), name
  magnitudes = np.abs(weights)
  top = magnitudes.max()
  first = int(round(float(threshold) / float(top) * NBINS))
  assert F32(first) / F32(NBINS) * top == threshold, name
  bins = np.minimum(np.floor(F32(NBINS) * (magnitudes / top)), NBINS - 1)
  share = np.mean(mask & (bins == first))
  achieved = 1.0 - mask.mean()
  assert target - share - 1e-6 <= achieved <= target + 1e-6, (name, achieved, target, share)


def _accuracy(logits, labels):
  return float(jnp.mean(jnp.argmax(logits, -1) == labels))


class LinenMLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(64)(x))
    x = nn.relu(nn.Dense(32)(x))
    return nn.Dense(10)(x)


@pytest.mark.slow
def test_linen_mlp_reaches_targets():
  x, y = _digits()
  hparams = jaxprune.get_pruning_hparams()
  hparams.update(target_sparsity=0.8, weight_sparsity_map=['Dense_2:0.5'], **SCHEDULE)
  model = LinenMLP()
  params = model.init(jax.random.key(0), x[:1])['params']
  tx = optax.chain(optax.adam(1e-2), jaxprune.pruning(hparams))
  opt_state = tx.init(params)

  @jax.jit
  def train_step(params, opt_state):
    def loss_fn(params):
      logits = model.apply({'params': params}, x)
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    grads = jax.grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  for _ in range(STEPS):
    params, opt_state = train_step(params, opt_state)
  state = jaxprune.find_pruning_state(opt_state)
  assert int(state.last_update_step) == STEPS - 1
  thresholds = jaxprune.get_thresholds(opt_state)
  assert sorted(thresholds) == ['Dense_0/kernel', 'Dense_1/kernel', 'Dense_2/kernel']
  for layer, target in (('Dense_0', 0.8), ('Dense_1', 0.8), ('Dense_2', 0.5)):
    _check_leaf(
      layer,
      params[layer]['kernel'],
      state.masks[layer]['kernel'],
      thresholds[f'{layer}/kernel'],
      target,
    )
    assert np.all(np.asarray(params[layer]['bias']) != 0)
  assert _accuracy(model.apply({'params': params}, x), y) > 0.9


class NNXMLP(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.linear1 = nnx.Linear(64, 64, rngs=rngs)
    self.linear2 = nnx.Linear(64, 10, rngs=rngs)

  def __call__(self, x):
    return self.linear2(jax.nn.relu(self.linear1(x)))


@pytest.mark.slow
@pytest.mark.parametrize('method', ['histogram', 'exact'])
def test_nnx_optimizer_reaches_targets(method):
  x, y = _digits()
  hparams = jaxprune.get_pruning_hparams()
  hparams.update(
    target_sparsity=0.75, weight_sparsity_map=['linear2:0.6'], threshold_method=method, **SCHEDULE
  )
  model = NNXMLP(nnx.Rngs(0))
  optimizer = nnx.Optimizer(
    model, optax.chain(optax.adam(1e-2), jaxprune.pruning(hparams)), wrt=nnx.Param
  )

  @nnx.jit
  def train_step(model, optimizer):
    def loss_fn(model):
      return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    optimizer.update(model, nnx.grad(loss_fn)(model))

  for _ in range(STEPS):
    train_step(model, optimizer)
  state = jaxprune.find_pruning_state(optimizer.opt_state)
  masks = jaxprune.get_masks(state)
  thresholds = jaxprune.get_thresholds(state)
  assert sorted(thresholds) == ['linear1/kernel', 'linear2/kernel']
  for layer, target in (('linear1', 0.75), ('linear2', 0.6)):
    kernel = np.asarray(getattr(model, layer).kernel[...])
    mask = np.asarray(masks[layer]['kernel'][...])
    if method == 'histogram':
      _check_leaf(layer, kernel, mask, thresholds[f'{layer}/kernel'], target)
    else:
      np.testing.assert_array_equal(kernel[~mask], 0.0)
      assert mask.sum() == round(kernel.size * (1 - target))
    sparsity = jaxprune.get_weight_sparsity(nnx.state(model, nnx.Param))
    assert float(sparsity[f'{layer}/kernel']) == pytest.approx(1.0 - mask.mean())
  assert _accuracy(model(x), y) > 0.9
