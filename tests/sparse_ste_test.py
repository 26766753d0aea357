"""jaxprune.sparse.ste: forward on masked weights, updates to the dense ones, magnitude and N:M."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxprune import sparse


def _params():
  rng = np.random.default_rng(3)
  return {
    'a': {
      'kernel': jnp.asarray(rng.normal(size=(16, 10)), jnp.float32),
      'bias': jnp.zeros((10,), jnp.float32),
    },
    'b': {'kernel': jnp.asarray(rng.normal(size=(8, 6)), jnp.float32)},
  }


def _top_k_mask(weights, k):
  order = np.argsort(-np.abs(weights).reshape(-1), kind='stable')
  mask = np.zeros(weights.size, bool)
  mask[order[:k]] = True
  return mask.reshape(weights.shape)


def _nm_reference(weights, n, m):
  """Keep the n largest |w| of every m consecutive entries along axis 0 (the input axis)."""
  mask = np.zeros(weights.shape, bool)
  for start in range(0, weights.shape[0], m):
    for col in range(weights.shape[1]):
      group = np.abs(weights[start : start + m, col])
      mask[start + np.argsort(-group, kind='stable')[:n], col] = True
  return mask


@pytest.mark.parametrize('nm', [None, '2:4'])
def test_ste_steps_against_numpy(nm):
  lr = 0.5
  tx = sparse.ste(optax.sgd(lr), 0.75 if nm is None else None, nm=nm)
  params = _params()
  state = tx.init(params)
  step = jax.jit(tx.update)
  dense = {n: np.asarray(params[n]['kernel']) for n in ('a', 'b')}
  rng = np.random.default_rng(4)
  for _ in range(4):
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    updates, state = step(grads, state, params)
    params = optax.apply_updates(params, updates)
    for name in ('a', 'b'):
      # The gradient (taken at the masked weights) reaches every dense weight.
      dense[name] = dense[name] - np.float32(lr) * np.asarray(grads[name]['kernel'])
      np.testing.assert_allclose(
        np.asarray(state.dense[name]['kernel']), dense[name], rtol=1e-6, atol=1e-7
      )
      got_dense = np.asarray(state.dense[name]['kernel'])
      want = (
        _nm_reference(got_dense, 2, 4)
        if nm
        else _top_k_mask(got_dense, round(got_dense.size * 0.25))
      )
      mask = np.asarray(state.masks[name]['kernel'])
      np.testing.assert_array_equal(mask, want)
      # The params are exactly the masked dense weights.
      np.testing.assert_array_equal(
        np.asarray(params[name]['kernel']), np.where(mask, got_dense, 0.0)
      )
  assert int(state.step) == 4


def test_ste_update_freq_and_errors():
  tx = sparse.ste(optax.sgd(0.5), 0.5, update_freq=3)
  params = _params()
  state = tx.init(params)
  step = jax.jit(tx.update)
  masks = []
  for i in range(4):
    grads = jax.tree.map(lambda p, i=i: jnp.full(p.shape, (-1.0) ** i, jnp.float32), params)
    updates, state = step(grads, state, params)
    params = optax.apply_updates(params, updates)
    masks.append(np.asarray(sparse.get_masks(state)['a']['kernel']))
  assert (masks[0] == masks[1]).all() and (masks[1] == masks[2]).all()
  assert masks[0].sum() == masks[3].sum() == 80
  with pytest.raises(ValueError, match='not divisible by M=3'):
    sparse.ste(optax.sgd(0.1), nm='1:3').init(_params())
  with pytest.raises(ValueError, match='update_freq=0'):
    sparse.ste(optax.sgd(0.1), update_freq=0)
