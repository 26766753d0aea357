"""jaxprune.oneshot on small layers against numpy references written here."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from oneshot_references import row_mask, sparsegpt_reference, stable_prune

import jaxprune
from jaxprune import oneshot


def _calibration(n=96, k=16, seed=0):
  """Inputs with correlated channels of very different scales, in two batches."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, k)) @ (np.eye(k) + 0.4 * rng.normal(size=(k, k)))
  x *= np.exp(rng.normal(size=k))
  return [jnp.asarray(x[: n // 2], jnp.float32), jnp.asarray(x[n // 2 :], jnp.float32)], x


def _linear(params, x):
  return x @ params['w']


def _setup(k=16, out=8, seed=0):
  batches, x = _calibration(k=k, seed=seed)
  w = np.random.default_rng(seed + 1).normal(size=(k, out)).astype(np.float32)
  return {'w': jnp.asarray(w)}, batches, x, w


def test_wanda_mask_is_the_numpy_rule():
  params, batches, x, w = _setup()
  norms = np.sqrt((x**2).sum(0))
  scores = np.abs(w.T) * norms  # (outputs, inputs)
  expected = ~np.stack([stable_prune(row, 8) for row in scores]).T
  new, masks = oneshot.prune(_linear, params, batches, method='wanda', sparsity=0.5)
  np.testing.assert_array_equal(np.asarray(masks['w']), expected)
  np.testing.assert_array_equal(np.asarray(new['w']), np.where(expected, w, 0))


def test_magnitude_per_layer_and_per_row():
  params, batches, _, w = _setup()
  per_layer = ~stable_prune(np.abs(w).ravel(), round(0.6 * w.size)).reshape(w.shape)
  # 0.6 of 16 inputs is 9.6 per row: 77 = round(0.6 * 128) in all, rows of 9 and 10.
  per_row = row_mask(np.abs(w.T), 0.6, None).T
  _, masks = oneshot.prune(_linear, params, batches, method='magnitude', sparsity=0.6)
  np.testing.assert_array_equal(np.asarray(masks['w']), per_layer)
  _, masks = oneshot.prune(_linear, params, batches, method='magnitude', sparsity=0.6, per_row=True)
  np.testing.assert_array_equal(np.asarray(masks['w']), per_row)
  assert int((~per_row).sum()) == 77


@pytest.mark.parametrize('nm', [None, (2, 4)])
def test_sparsegpt_equals_the_papers_update(nm):
  params, batches, x, w = _setup()
  h = 2 * x.T @ x / len(x)
  expected_w, expected_mask = sparsegpt_reference(w.T, h, 0.5, nm, blocksize=8, percdamp=0.01)
  new, masks = oneshot.prune(
    _linear, params, batches, method='sparsegpt', sparsity=None if nm else 0.5, nm=nm, blocksize=8
  )
  np.testing.assert_array_equal(np.asarray(masks['w']), expected_mask.T)
  np.testing.assert_allclose(np.asarray(new['w']), expected_w.T, rtol=1e-4, atol=1e-4)
  assert np.mean(expected_mask) == 0.5


def test_sparsegpt_reconstructs_better_than_magnitude_and_wanda():
  params, batches, x, w = _setup(k=32, out=16, seed=3)
  errors = {}
  for method in oneshot.METHODS:
    new, _ = oneshot.prune(_linear, params, batches, method=method, sparsity=0.5)
    errors[method] = np.sum((x @ w - x @ np.asarray(new['w'], np.float64)) ** 2)
  assert errors['sparsegpt'] < errors['wanda']
  assert errors['sparsegpt'] < errors['magnitude']


@pytest.mark.parametrize('method', oneshot.METHODS)
@pytest.mark.parametrize('nm', ['2:4', '4:8'])
def test_nm_masks_are_valid(method, nm):
  params, batches, _, _ = _setup()
  n, m = jaxprune.parse_nm(nm)
  new, masks = oneshot.prune(_linear, params, batches, method=method, nm=nm)
  groups = np.asarray(masks['w']).reshape(16 // m, m, 8)  # groups along the input axis
  np.testing.assert_array_equal(groups.sum(axis=1), n)
  assert np.all(np.asarray(new['w'])[~np.asarray(masks['w'])] == 0)


def _two_layers(params, x):
  return jax.nn.relu(x @ params['w1']) @ params['w2']


def test_sequential_inputs_come_from_the_pruned_earlier_layer():
  rng = np.random.default_rng(5)
  params = {
    'w1': jnp.asarray(rng.normal(size=(16, 24)), jnp.float32),
    'w2': jnp.asarray(rng.normal(size=(24, 8)), jnp.float32),
    'scale': jnp.ones(3),
  }
  batches, x = _calibration()
  expected = {}
  for sequential in (True, False):
    new, masks = oneshot.prune(
      _two_layers,
      params,
      batches,
      method='wanda',
      sparsity=0.5,
      overrides={'w1': 0.9},
      sequential=sequential,
    )
    w1 = np.asarray(new['w1'] if sequential else params['w1'], np.float64)
    hidden = np.maximum(x @ w1, 0)
    scores = np.abs(np.asarray(params['w2']).T) * np.sqrt((hidden**2).sum(0))
    expected[sequential] = ~np.stack([stable_prune(row, 12) for row in scores]).T
    np.testing.assert_array_equal(np.asarray(masks['w2']), expected[sequential])
    assert masks['scale'] is None
  assert not np.array_equal(expected[True], expected[False])


def test_overrides_and_masks_work_with_apply_masks():
  rng = np.random.default_rng(6)
  params = {
    'w1': jnp.asarray(rng.normal(size=(16, 24)), jnp.float32),
    'w2': jnp.asarray(rng.normal(size=(24, 8)), jnp.float32),
    'scale': jnp.ones(3),
  }
  batches, _ = _calibration()
  new, masks = oneshot.prune(
    _two_layers, params, batches, method='sparsegpt', sparsity=0.5, overrides={'w2': '2:4'}
  )
  assert float(jnp.mean(masks['w1'])) == 0.5
  assert bool(jaxprune.is_nm_sparse(new['w2'], 2, 4, axis=0))
  same = jaxprune.apply_masks(new, masks)
  assert all(
    np.array_equal(a, b) for a, b in zip(jax.tree.leaves(same), jax.tree.leaves(new), strict=True)
  )
  _, masks = oneshot.prune(
    _two_layers, params, batches, method='wanda', sparsity=0.5, overrides={'w1': None}
  )
  assert masks['w1'] is None and masks['w2'] is not None


def test_bad_inputs_are_clear_errors_that_change_nothing():
  params, batches, _, w = _setup()
  cases = [
    (dict(batches=[], method='wanda', sparsity=0.5), 'at least one calibration batch'),
    (dict(method='wanda', sparsity=1.0), r'sparsity=1.0: must be in \[0, 1\)'),
    (dict(method='sparsegpt', sparsity=-0.1), r'sparsity=-0.1: must be in \[0, 1\)'),
    (dict(method='wanda', nm='3:6'), 'not divisible by M=6'),
    (dict(method='obs', sparsity=0.5), "method='obs'"),
    (dict(method='wanda'), 'give sparsity'),
    (dict(method='wanda', sparsity=0.5, overrides={'w': 0.5, '^w$': 0.2}), 'matches several'),
  ]
  for kwargs, message in cases:
    with pytest.raises(ValueError, match=message):
      oneshot.prune(_linear, params, kwargs.pop('batches', batches), **kwargs)
  # Two equal input channels: X^T X is singular, and undampened Cholesky fails.
  x = np.array(batches[0])
  x[:, 1] = x[:, 0]
  with pytest.raises(ValueError, match='singular.*percdamp > 0'):
    oneshot.prune(_linear, params, [jnp.asarray(x)], method='sparsegpt', sparsity=0.5, percdamp=0.0)
  np.testing.assert_array_equal(np.asarray(params['w']), w)


def test_calibration_data_and_weights_the_methods_cannot_use_are_named():
  """One array (read as one batch per row), NaN/Inf batches (NaN statistics for Wanda too)
  and integer weights are one-line errors naming the fix."""
  params, batches, _, _ = _setup()
  with pytest.raises(ValueError, match=r'one array of shape \(48, 16\).*\[x\] for one batch'):
    oneshot.prune(_linear, params, batches[0], method='wanda', sparsity=0.5)
  bad = np.array(batches[1])
  bad[3, 2] = np.nan
  for method in ('wanda', 'sparsegpt'):
    with pytest.raises(ValueError, match=r'calibration_batches\[1\] holds NaN or Inf'):
      oneshot.prune(_linear, params, [batches[0], jnp.asarray(bad)], method=method, sparsity=0.5)
  ints = {'w': jnp.ones((16, 8), jnp.int32)}
  with pytest.raises(ValueError, match=r"layer 'w' has dtype int32.*overrides=\{'w': None\}"):
    oneshot.prune(
      lambda p, x: x @ p['w'].astype(jnp.float32), ints, batches, method='magnitude', sparsity=0.5
    )


def test_dead_inputs_are_pruned_without_nan():
  params, batches, x, w = _setup()
  dead = [np.asarray(b).copy() for b in batches]
  for b in dead:
    b[:, 3] = 0.0
  x = np.concatenate(dead)
  expected_w, _ = sparsegpt_reference(w.T, 2 * x.T @ x / len(x), 0.5, None, 16, 0.01)
  new, _ = oneshot.prune(
    _linear, params, [jnp.asarray(b) for b in dead], method='sparsegpt', sparsity=0.5
  )
  assert np.all(np.asarray(new['w'])[3] == 0)
  np.testing.assert_allclose(np.asarray(new['w']), expected_w.T, rtol=1e-4, atol=1e-4)


def test_a_flax_module_or_its_apply_is_the_model():
  """`prune(model, params, ...)` and `prune(model.apply, ...)` call
  `model.apply({'params': params}, batch)` (or `model.apply(variables, batch)`): the same
  result as the explicit function; an error inside the model is one line with its cause."""
  import flax.linen as nn

  model = nn.Sequential([nn.Dense(32), nn.relu, nn.Dense(8)])
  x = jax.random.normal(jax.random.key(0), (16, 12))
  variables = model.init(jax.random.key(1), x)
  expected = oneshot.prune(
    lambda p, x: model.apply({'params': p}, x),
    variables['params'],
    [x],
    method='wanda',
    sparsity=0.5,
  )
  for fn, params in (
    (model, variables['params']),
    (model.apply, variables['params']),
    (model.apply, variables),
  ):
    got = oneshot.prune(fn, params, [x], method='wanda', sparsity=0.5)
    if params is variables:
      got = jax.tree.map(lambda t: t['params'], got, is_leaf=lambda t: 'params' in t)
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(got), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(
    ValueError,
    match=r'fn\(params, batch\) raised ScopeParamShapeError: .*'
    r"lambda p, x: model.apply\(\{'params': p\}, x\)",
  ) as err:
    oneshot.prune(model, variables['params'], [jnp.ones((16, 7))], method='wanda', sparsity=0.5)
  assert type(err.value.__cause__).__name__ == 'ScopeParamShapeError'
  with pytest.raises(TypeError, match='fn=3: must be the model'):
    oneshot.prune(3, variables['params'], [x], method='wanda', sparsity=0.5)
