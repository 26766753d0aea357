"""jaxprune.oneshot on layers stacked under `lax.scan`: Flax `nn.scan`, a hand-written
`lax.scan`, haiku's `layer_stack` and a scan over equinox blocks give what the same model
written unrolled gives, and a numpy reference of the sequential order."""

import equinox as eqx
import flax.linen as nn
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from oneshot_references import wanda_mask

import jaxprune
from jaxprune import oneshot
from jaxprune.oneshot import _api, _capture

DEPTH, WIDTH, HIDDEN = 4, 16, 32


def _batches():
  """Two batches with input channels of very different scales."""
  rng = np.random.default_rng(0)
  scales = np.exp(rng.normal(size=WIDTH))
  return [jnp.asarray(rng.normal(size=(24, WIDTH)) * scales, jnp.float32) for _ in range(2)]


class _Block(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    h = nn.relu(nn.Dense(HIDDEN, name='up')(x))
    return x + nn.Dense(WIDTH, use_bias=False, name='down')(h), None


class _Scanned(nn.Module):
  """An input layer, DEPTH residual blocks under `nn.scan` (stacked along `axis`), a head."""

  axis: int = 0

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(WIDTH, name='inp')(x)
    x, _ = nn.scan(
      _Block, variable_axes={'params': self.axis}, split_rngs={'params': True}, length=DEPTH
    )(name='blocks')(x, None)
    return nn.Dense(8, name='head')(x)


def _unrolled(p, x):
  """`_Scanned` written out, with one leaf per block."""
  x = x @ p['inp']['kernel'] + p['inp']['bias']
  for block in p['blocks']:
    h = jax.nn.relu(x @ block['up']['kernel'] + block['up']['bias'])
    x = x + h @ block['down']['kernel']
  return x @ p['head']['kernel'] + p['head']['bias']


def _unstack(p, axis):
  """The params of `_Scanned` as `_unrolled` takes them."""
  blocks = [
    jax.tree.map(lambda a, i=i: jnp.take(a, i, axis=axis), p['blocks']) for i in range(DEPTH)
  ]
  return {'inp': p['inp'], 'head': p['head'], 'blocks': blocks}


def _flax(axis=0):
  model = _Scanned(axis)
  params = model.init(jax.random.key(0), _batches()[0])['params']
  return (lambda p, x: model.apply({'params': p}, x)), params


def _restack(tree, axis=0):
  """The unrolled model's params (or masks) stacked as `_Scanned` holds them."""
  blocks = jax.tree.map(lambda *xs: jnp.stack(xs, axis), *tree['blocks'])
  return {'blocks': blocks, 'head': tree['head'], 'inp': tree['inp']}


@pytest.mark.parametrize('method', oneshot.METHODS)
@pytest.mark.parametrize('target', [dict(sparsity=0.5), dict(nm='2:4')], ids=['50%', '2:4'])
def test_flax_nn_scan_equals_the_unrolled_model(method, target):
  fn, params = _flax()
  batches = _batches()
  new, masks = oneshot.prune(fn, params, batches, method=method, **target)
  ref_new, ref_masks = oneshot.prune(
    _unrolled, _unstack(params, 0), batches, method=method, **target
  )
  for got, want in zip(jax.tree.leaves(masks), jax.tree.leaves(_restack(ref_masks)), strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  # SparseGPT's updated weights too: the same float32 operations, in the same order.
  for got, want in zip(jax.tree.leaves(new), jax.tree.leaves(_restack(ref_new)), strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  up = np.asarray(masks['blocks']['up']['kernel'])
  assert up.shape == (DEPTH, WIDTH, HIDDEN) and up.mean() == 0.5
  assert masks['blocks']['up']['bias'] is None


def test_stacked_on_another_axis_and_not_sequential():
  """`variable_axes={'params': 1}` stacks the blocks along axis 1 (the jaxpr moves it to
  the front for the scan); `sequential=False` measures every slice on the dense model."""
  fn, params = _flax(axis=1)
  batches = _batches()
  for sequential in (True, False):
    _, masks = oneshot.prune(
      fn, params, batches, method='wanda', sparsity=0.5, sequential=sequential
    )
    _, ref = oneshot.prune(
      _unrolled, _unstack(params, 1), batches, method='wanda', sparsity=0.5, sequential=sequential
    )
    for got, want in zip(
      jax.tree.leaves(masks), jax.tree.leaves(_restack(ref, axis=1)), strict=True
    ):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_layers_of_a_stack_are_slices_in_the_order_the_scan_runs_them():
  fn, params = _flax()
  batches = _batches()
  names = [
    'blocks/down/kernel',
    'blocks/up/bias',
    'blocks/up/kernel',
    'head/bias',
    'head/kernel',
    'inp/bias',
    'inp/kernel',
  ]
  layers = oneshot.find_layers(jax.make_jaxpr(fn)(params, batches[0]), names)
  order = (
    ['inp/kernel']
    + [f'blocks/{n}/kernel[{i}]' for i in range(DEPTH) for n in ('up', 'down')]
    + ['head/kernel']
  )
  assert [layer.name for layer in layers] == order
  assert [layer.wave for layer in layers] == list(range(len(order)))
  up = layers[1]
  assert (up.stack.axis, up.stack.index, up.stack.length, up.in_axes) == (0, 0, DEPTH, (1,))


def _hand_scan(p, x):
  """A hand-written reversed `lax.scan` over stacked weights, with stacked outputs (ys)."""

  def step(h, w):
    h = jnp.tanh(h @ w['a']) @ w['b']
    return h, jnp.sum(h)

  h, ys = jax.lax.scan(step, x, p['stack'], reverse=True)
  return h @ p['head'] + jnp.sum(ys)


def test_hand_written_reversed_scan_against_numpy():
  """Wanda, sequential: the slices pruned last step first (the scan is reversed), each
  from the inputs the already pruned steps give, then the head; in numpy."""
  rng = np.random.default_rng(1)
  params = {
    'stack': {
      'a': rng.normal(size=(3, WIDTH, HIDDEN)),
      'b': rng.normal(size=(3, HIDDEN, WIDTH)) / 4,
    },
    'head': rng.normal(size=(WIDTH, 8)),
  }
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
  batches = _batches()
  new, masks = oneshot.prune(_hand_scan, params, batches, method='wanda', sparsity=0.5)
  x = np.concatenate([np.asarray(b, np.float64) for b in batches])
  w = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  for i in (2, 1, 0):
    keep_a = wanda_mask(w['stack']['a'][i].T, x, 0.5).T
    w['stack']['a'][i] *= keep_a
    hidden = np.tanh(x @ w['stack']['a'][i])
    keep_b = wanda_mask(w['stack']['b'][i].T, hidden, 0.5).T
    w['stack']['b'][i] *= keep_b
    x = hidden @ w['stack']['b'][i]
    np.testing.assert_array_equal(np.asarray(masks['stack']['a'][i]), keep_a)
    np.testing.assert_array_equal(np.asarray(masks['stack']['b'][i]), keep_b)
  np.testing.assert_array_equal(np.asarray(masks['head']), wanda_mask(w['head'].T, x, 0.5).T)
  np.testing.assert_allclose(np.asarray(new['stack']['a']), w['stack']['a'], rtol=1e-6)


@pytest.mark.slow
def test_haiku_layer_stack_and_equinox_scan_equal_unrolled():
  batches = _batches()

  def block(x):
    h = jax.nn.relu(hk.Linear(HIDDEN, name='up')(x))
    return x + hk.Linear(WIDTH, with_bias=False, name='down')(h)

  model = hk.transform(lambda x: hk.layer_stack(DEPTH)(block)(x))
  params = model.init(jax.random.key(0), batches[0])
  stacked = {k.split('/')[-1]: v for k, v in params.items()}

  def unrolled(p, x):
    for b in p:
      x = x + jax.nn.relu(x @ b['up']['w'] + b['up']['b']) @ b['down']['w']
    return x

  blocks = [jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(DEPTH)]
  _, masks = oneshot.prune(
    lambda p, x: model.apply(p, None, x), params, batches, method='wanda', sparsity=0.5
  )
  _, ref = oneshot.prune(unrolled, blocks, batches, method='wanda', sparsity=0.5)
  for name in ('up', 'down'):
    got = masks[f'__layer_stack_no_per_layer/{name}']['w']
    np.testing.assert_array_equal(np.asarray(got), np.stack([r[name]['w'] for r in ref]))

  class Block(eqx.Module):
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, key):
      k1, k2 = jax.random.split(key)
      self.up = eqx.nn.Linear(WIDTH, HIDDEN, key=k1)
      self.down = eqx.nn.Linear(HIDDEN, WIDTH, use_bias=False, key=k2)

    def __call__(self, x):
      return x + self.down(jax.nn.relu(self.up(x)))

  stack = eqx.filter_vmap(Block)(jax.random.split(jax.random.key(2), DEPTH))
  arrays, static = eqx.partition(stack, eqx.is_array)

  def eqx_fn(p, x):
    step = lambda h, b: (jax.vmap(eqx.combine(b, static))(h), None)  # noqa: E731
    return jax.lax.scan(step, x, p)[0]

  def eqx_unrolled(p, x):
    for b in p:
      x = x + jax.nn.relu(x @ b['up'].T + b['bias']) @ b['down'].T
    return x

  blocks = [
    {'up': arrays.up.weight[i], 'bias': arrays.up.bias[i], 'down': arrays.down.weight[i]}
    for i in range(DEPTH)
  ]
  _, masks = oneshot.prune(eqx_fn, arrays, batches, method='wanda', nm='2:4')
  _, ref = oneshot.prune(eqx_unrolled, blocks, batches, method='wanda', nm='2:4')
  np.testing.assert_array_equal(np.asarray(masks.up.weight), np.stack([r['up'] for r in ref]))
  np.testing.assert_array_equal(np.asarray(masks.down.weight), np.stack([r['down'] for r in ref]))


def test_a_stack_is_measured_one_slice_at_a_time(monkeypatch):
  """The collector gives one slice's Gram matrix for a stack, the slice asked for; with the
  statistics too large to measure all layers in one pass, the result is the same."""
  fn, params = _flax()
  batches = _batches()
  closed = jax.make_jaxpr(fn)(params, batches[0])
  layers = oneshot.find_layers(closed, [name for name, _ in jaxprune.named_leaves(params)])
  up = [layer for layer in layers if layer.name.startswith('blocks/up/kernel')]
  collect = _capture.collector(closed, up, ('gram',))
  scan = up[0].stack.scan
  x = np.asarray(_unrolled_inputs(params, batches[0], 2))
  stats, rows = collect(jax.tree.leaves(params), batches[:1], {scan: 2})[up[0].leaf]
  assert stats['gram'].shape == (1, WIDTH, WIDTH) and rows == len(x)
  np.testing.assert_allclose(np.asarray(stats['gram'][0]), x.T @ x, rtol=1e-4, atol=1e-3)
  expected = oneshot.prune(fn, params, batches, method='sparsegpt', sparsity=0.5)
  monkeypatch.setattr(_api, '_SHARED_STATS_LIMIT', 0)
  got = oneshot.prune(fn, params, batches, method='sparsegpt', sparsity=0.5)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _unrolled_inputs(params, x, block):
  """The input of block `block`'s up projection in the dense model, in numpy."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), _unstack(params, 0))
  x = np.asarray(x, np.float64) @ p['inp']['kernel'] + p['inp']['bias']
  for b in p['blocks'][:block]:
    x = x + np.maximum(x @ b['up']['kernel'] + b['up']['bias'], 0) @ b['down']['kernel']
  return x
