"""What jaxprune.oneshot leaves dense, and says so, and the report of what it pruned."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from oneshot_references import wanda_mask

from jaxprune import oneshot


def _calibration(k=16, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(64, k)) * np.exp(rng.normal(size=k))
  return [jnp.asarray(x[:32], jnp.float32), jnp.asarray(x[32:], jnp.float32)], x


def _params(shapes, seed=1):
  rng = np.random.default_rng(seed)
  return {name: jnp.asarray(rng.normal(size=shape), jnp.float32) for name, shape in shapes.items()}


def _unprunable(p, x):
  """One layer `w`, and weights the methods cannot prune, each for another reason."""
  h = x @ p['w']  # a layer
  h = h + jnp.take(p['emb'], jnp.argmax(x, axis=1), axis=0)  # a lookup
  h = jax.lax.while_loop(lambda c: c[1] < 2, lambda c: (c[0] @ p['loop'], c[1] + 1), (h, 0))[0]
  h = jax.lax.cond(jnp.sum(h) > 0, lambda a: a @ p['branch'], lambda a: -a, h)
  h = h @ p['twice'] + h @ p['twice'].T  # two contractions
  h = jax.lax.scan(lambda c, _: (c @ p['const'], None), h, None, length=2)[0]
  h = jax.lax.fori_loop(0, 2, lambda i, c: c @ p['indexed'][i], h)  # a scan slicing a const
  nested = jax.lax.scan(
    lambda c, w: (jax.lax.scan(lambda d, v: (d @ v, None), c, w)[0], None), h, p['nested']
  )[0]
  return nested * p['scale'] + p['bias'] + p['row']


_SHAPES = {
  'w': (16, 8),
  'emb': (16, 8),
  'loop': (8, 8),
  'branch': (8, 8),
  'twice': (8, 8),
  'const': (8, 8),
  'indexed': (2, 8, 8),
  'nested': (2, 2, 8, 8),
  'scale': (8,),
  'bias': (8,),
  'row': (1, 8),
}
_REASONS = {
  'branch': 'used inside a cond branch',
  'const': 'a const of a scan',
  'emb': 'read by a gather',
  'loop': 'used inside a while loop',
  'indexed': 'a const of a scan that its body slices per step (w[i]); pass the '
  "stacked weights as the scan's xs",
  'nested': 'used in a scan nested inside a scan',
  'twice': 'used by several products that contract different axes',
}


def test_weights_left_dense_are_named_in_one_warning_with_the_reason():
  """Vectors and a (1, 8) row are not weights; the others are named, once."""
  params, (batches, _) = _params(_SHAPES), _calibration()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    new, masks, report = oneshot.prune_with_report(
      _unprunable, params, batches, method='wanda', sparsity=0.5
    )
  assert len(caught) == 1 and caught[0].category is UserWarning
  message = str(caught[0].message)
  assert message.startswith('oneshot.prune leaves 7 weight(s) dense') and '\n' not in message
  for name, reason in _REASONS.items():
    assert f"'{name}' ({reason}" in message
  assert {name: reason for name, reason in report.skipped}.keys() == _REASONS.keys()
  assert all(r.startswith(_REASONS[n]) for n, r in report.skipped)
  assert [layer.name for layer in report.layers] == ['w']
  assert all(masks[name] is None for name in _SHAPES if name != 'w')
  for name in _SHAPES:
    if name != 'w':
      np.testing.assert_array_equal(np.asarray(new[name]), np.asarray(params[name]))


def test_no_layer_at_all_is_an_error_naming_the_reasons():
  params = _params({'loop': (16, 16)})
  batches, _ = _calibration()
  fn = lambda p, x: jax.lax.while_loop(  # noqa: E731
    lambda c: c[1] < 2, lambda c: (c[0] @ p['loop'], c[1] + 1), (x, 0)
  )[0]
  with pytest.raises(ValueError, match=r"found no layer .* 'loop' \(used inside a while loop\)"):
    oneshot.prune(fn, params, batches, method='wanda', sparsity=0.5)


def _two_layers(p, x):
  return jax.nn.relu(x @ p['w1']) @ p['w2']


@pytest.mark.parametrize('method', oneshot.METHODS)
def test_report_gives_each_layers_error_on_its_calibration_inputs(method):
  """The error of each layer is ||X W - X W'||^2 / ||X W||^2 on its inputs: the calibration
  batches for w1, the hidden units of the pruned w1 for w2 (sequential); worked out in
  numpy from the pruned params. The params and masks are `prune`'s."""
  params = _params({'w1': (16, 24), 'w2': (24, 8)})
  batches, x = _calibration()
  target = dict(sparsity=0.5) if method != 'wanda' else dict(nm='2:4')
  new, masks, report = oneshot.prune_with_report(
    _two_layers, params, batches, method=method, **target
  )
  plain = oneshot.prune(_two_layers, params, batches, method=method, **target)
  for a, b in zip(jax.tree.leaves((new, masks)), jax.tree.leaves(plain), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  w1, w2 = (np.asarray(params[k], np.float64) for k in ('w1', 'w2'))
  p1, p2 = (np.asarray(new[k], np.float64) for k in ('w1', 'w2'))
  hidden = np.maximum(x @ p1, 0)
  expected = [
    np.sum((x @ w1 - x @ p1) ** 2) / np.sum((x @ w1) ** 2),
    np.sum((hidden @ w2 - hidden @ p2) ** 2) / np.sum((hidden @ w2) ** 2),
  ]
  assert [layer.name for layer in report.layers] == ['w1', 'w2']
  np.testing.assert_allclose([layer.error for layer in report.layers], expected, rtol=1e-3)
  assert [layer.shape for layer in report.layers] == [(24, 16), (8, 24)]
  assert [layer.target for layer in report.layers] == ['2:4' if 'nm' in target else '50%'] * 2
  assert [layer.sparsity for layer in report.layers] == [0.5, 0.5]
  assert [layer.wave for layer in report.layers] == [0, 1]
  if method == 'wanda':
    np.testing.assert_array_equal(np.asarray(masks['w2']), wanda_mask(w2.T, hidden, nm=(2, 4)).T)


def test_report_of_a_stack_has_a_line_per_slice_and_prints_a_table():
  rng = np.random.default_rng(3)
  params = {'stack': jnp.asarray(rng.normal(size=(3, 16, 16)), jnp.float32)}
  batches, _ = _calibration()
  fn = lambda p, x: jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, p['stack'])[0]  # noqa: E731
  _, masks, report = oneshot.prune_with_report(
    fn, params, batches, method='sparsegpt', sparsity=0.5, overrides={r'\[1\]': 0.25}
  )
  assert [(r.name, r.target, r.sparsity) for r in report.layers] == [
    ('stack[0]', '50%', 0.5),
    ('stack[1]', '25%', 0.25),
    ('stack[2]', '50%', 0.5),
  ]
  assert np.asarray(masks['stack']).mean(axis=(1, 2)).tolist() == [0.5, 0.75, 0.5]
  lines = str(report).splitlines()
  assert lines[0].split() == [
    'layer',
    'outputs',
    'x',
    'inputs',
    'target',
    'sparsity',
    'rel.',
    'error',
  ]
  assert lines[2].split()[:5] == ['stack[1]', '16', 'x', '16', '25%']
  assert all(0 < r.error < 1 for r in report.layers)
