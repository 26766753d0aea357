"""Channel permutation for N:M (`oneshot.permute_channels`, `prune(permute=)`): the model
computes the same function, the kept score never falls (checked with numpy scores written
here), and what cannot be reordered is refused in one line."""

import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxprune
from jaxprune import oneshot
from jaxprune.oneshot import _permute


def kept(scores, n, m):
  """Sum over rows and groups of m consecutive columns of the n largest scores, by loops."""
  total = 0.0
  for row in scores:
    for j in range(0, len(row), m):
      total += sum(sorted(row[j : j + m])[m - n :])
  return total


def test_best_order_beats_the_identity_and_finds_the_best_grouping_of_eight():
  rng = np.random.default_rng(0)
  scores = rng.exponential(size=(6, 8)) * rng.exponential(size=8)
  order = _permute.best_order(scores, 2, 4)
  assert sorted(order) == list(range(8))
  # Every split of 8 channels into two groups of 4 (the order within a group is moot).
  best = max(
    kept(scores[:, list(first) + [c for c in range(8) if c not in first]], 2, 4)
    for first in itertools.combinations(range(8), 4)
  )
  assert kept(scores[:, order], 2, 4) == pytest.approx(best)
  assert best > kept(scores, 2, 4)


@pytest.mark.parametrize(('n', 'm'), [(2, 4), (4, 8), (1, 4)])
def test_best_order_never_lowers_the_kept_score(n, m):
  for seed in range(5):
    rng = np.random.default_rng(seed)
    scores = rng.exponential(size=(16, 64)) * rng.exponential(size=64) ** 2
    order = _permute.best_order(scores, n, m)
    assert sorted(order) == list(range(64))
    assert kept(scores[:, order], n, m) >= kept(scores, n, m) - 1e-9


class _Residual(nn.Module):
  """An input layer, a residual MLP, a LayerNorm and a head: the residual stream's channels
  are in a, down, ln and head; the hidden ones in up and down."""

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(32, name='a')(x)
    h = nn.relu(nn.Dense(64, name='up')(x))
    x = x + nn.Dense(32, name='down')(h)
    return nn.Dense(10, name='head')(nn.LayerNorm(name='ln')(x))


def _residual():
  model = _Residual()
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(48, 16)) * np.exp(rng.normal(size=16)), jnp.float32)
  params = model.init(jax.random.key(0), x)['params']
  return (lambda p, x: model.apply({'params': p}, x)), params, x


def _wanda_scores(kernel, x):
  """Wanda's scores of a Dense kernel (inputs, outputs) as (outputs, inputs), in numpy."""
  return np.abs(np.asarray(kernel, np.float64).T) * np.sqrt((np.asarray(x, np.float64) ** 2).sum(0))


@pytest.mark.slow
def test_permuted_model_computes_the_same_function_and_keeps_more():
  fn, params, x = _residual()
  new, done = oneshot.permute_channels(fn, params, [x], nm='2:4', layers='up|down|head')
  np.testing.assert_allclose(
    np.asarray(fn(new, x)), np.asarray(fn(params, x)), rtol=1e-5, atol=1e-5
  )
  by_layers = {p.layers: p for p in done}
  assert set(by_layers) == {('up/kernel', 'head/kernel'), ('down/kernel',)}
  # The residual stream's channels: every weight holding them moves, and the kept score of
  # up and head (their inputs' norms measured here, in the dense model) rises.
  stream = by_layers[('up/kernel', 'head/kernel')]
  assert {leaf for leaf, _ in stream.members} == {
    'a/kernel',
    'a/bias',
    'down/kernel',
    'down/bias',
    'ln/scale',
    'ln/bias',
    'up/kernel',
    'head/kernel',
  }
  hidden_in = np.asarray(x @ params['a']['kernel'] + params['a']['bias'])
  ln_in = np.asarray(
    nn.LayerNorm().apply(
      {'params': params['ln']},
      hidden_in
      + np.asarray(
        jax.nn.relu(hidden_in @ params['up']['kernel'] + params['up']['bias'])
        @ params['down']['kernel']
        + params['down']['bias']
      ),
    )
  )
  before = kept(_wanda_scores(params['up']['kernel'], hidden_in), 2, 4) + kept(
    _wanda_scores(params['head']['kernel'], ln_in), 2, 4
  )
  new_hidden = np.asarray(x @ new['a']['kernel'] + new['a']['bias'])
  new_ln = ln_in[:, stream.order]
  after = kept(_wanda_scores(new['up']['kernel'], new_hidden), 2, 4) + kept(
    _wanda_scores(new['head']['kernel'], new_ln), 2, 4
  )
  assert stream.kept_before == pytest.approx(before, rel=1e-4)
  assert stream.kept_after == pytest.approx(after, rel=1e-4)
  assert after >= before
  np.testing.assert_array_equal(new['a']['kernel'], params['a']['kernel'][:, stream.order])
  # up's inputs are stream channels, its outputs the hidden ones (the other group's order).
  hidden = by_layers[('down/kernel',)].order
  np.testing.assert_array_equal(
    new['up']['kernel'], params['up']['kernel'][stream.order][:, hidden]
  )


def test_prune_with_permute_gives_nm_masks_in_the_new_order():
  fn, params, x = _residual()
  pruned, masks, report = oneshot.prune_with_report(
    fn, params, [x], method='wanda', nm='2:4', permute='down'
  )
  assert bool(jaxprune.is_nm_sparse(pruned['down']['kernel'], 2, 4))
  (done,) = report.permutations
  assert done.layers == ('down/kernel',) and done.kept_after > done.kept_before
  # The hidden channels moved in up (outputs) and down (inputs) alike.
  np.testing.assert_array_equal(
    np.asarray(pruned['up']['bias']), np.asarray(params['up']['bias'])[done.order]
  )
  assert 'permuted the inputs of down/kernel' in str(report)


def test_convolutions_are_permuted_along_their_input_features():
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.normal(size=(2, 8, 8, 3)), jnp.float32)

  class Convs(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.relu(nn.Conv(16, (3, 3), name='c0')(x))
      x = nn.relu(nn.Conv(8, (3, 3), name='c1')(x))
      return nn.Conv(4, (1, 1), name='c2')(x)

  model = Convs()
  params = model.init(jax.random.key(0), x)['params']
  fn = lambda p, x: model.apply({'params': p}, x)  # noqa: E731
  new, done = oneshot.permute_channels(
    fn, params, [x], nm='2:4', layers='c1|c2', method='magnitude'
  )
  np.testing.assert_allclose(
    np.asarray(fn(new, x)), np.asarray(fn(params, x)), rtol=1e-5, atol=1e-5
  )
  for p in done:
    (layer,) = p.layers
    kernel = np.asarray(params[layer.split('/')[0]]['kernel'])  # HWIO
    scores = np.abs(np.moveaxis(kernel, 2, -1)).reshape(-1, kernel.shape[2])
    assert p.kept_before == pytest.approx(kept(scores, 2, 4), rel=1e-5)
    assert p.kept_after == pytest.approx(kept(scores[:, p.order], 2, 4), rel=1e-5)
    assert p.kept_after >= p.kept_before


def _attention(p, x):
  """One attention head split: q/k/v, a reshape into 2 heads, the output projection."""
  b, d = x.shape[0], x.shape[-1]
  q, k, v = (jnp.reshape(x @ p[n], (b, -1, 2, d // 2)) for n in ('q', 'k', 'v'))
  att = jax.nn.softmax(jnp.einsum('bthd,bshd->bhts', q, k), axis=-1)
  out = jnp.einsum('bhts,bshd->bthd', att, v).reshape(b, -1, d)
  return jax.nn.relu(out @ p['o']) @ p['w']


def test_what_cannot_be_reordered_is_refused_in_one_line():
  fn, params, x = _residual()
  cases = [
    (
      dict(layers='a/'),
      r"'a/kernel' cannot be reordered \(their channel group: reaches model input",
    ),
    (dict(layers=True), r"'a/kernel'"),
  ]
  rng = np.random.default_rng(0)
  att = {n: jnp.asarray(rng.normal(size=(8, 8)), jnp.float32) for n in 'qkvow'}
  xa = jnp.asarray(rng.normal(size=(2, 4, 8)), jnp.float32)
  for kwargs, match in cases:
    with pytest.raises(ValueError, match=match) as info:
      oneshot.permute_channels(fn, params, [x], nm='2:4', **kwargs)
    assert '\n' not in str(info.value)
  with pytest.raises(ValueError, match=r"layer 'o'.* a merged axis \(a reshape into heads") as info:
    oneshot.permute_channels(_attention, att, [xa], nm='2:4', layers='^o$')
  assert '\n' not in str(info.value)

  # A per-channel constant the model captures cannot move with the channels.
  scale = jnp.asarray(np.linspace(0.5, 2, 64), jnp.float32)

  def captured(p, x):
    return (jax.nn.relu(x @ p['up']) * scale) @ p['down']

  mlp = {
    'up': jnp.asarray(rng.normal(size=(16, 64)), jnp.float32),
    'down': jnp.asarray(rng.exponential(size=(64, 8)), jnp.float32),
  }
  with pytest.raises(ValueError, match=r"changed the model's outputs") as info:
    oneshot.permute_channels(captured, mlp, [x], nm='2:4', layers='down')
  assert '\n' not in str(info.value)


def test_stacks_patterns_and_targets_are_checked():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(8, 8)), jnp.float32)

  def scanned(p, x):
    return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, p['w'])[0]

  stack = {'w': jnp.asarray(rng.normal(size=(2, 8, 8)), jnp.float32)}
  with pytest.raises(ValueError, match=r"'w\[0\]' is a slice of weights stacked under a scan"):
    oneshot.permute_channels(scanned, stack, [x], nm='2:4')
  fn, params, xr = _residual()
  with pytest.raises(ValueError, match=r'different N:M patterns'):
    oneshot.prune(
      fn, params, [xr], method='wanda', nm='2:4', overrides={'head': '4:8'}, permute='up|head'
    )
  with pytest.raises(ValueError, match=r"permute: invalid regex '\('"):
    oneshot.prune(fn, params, [xr], method='wanda', nm='2:4', permute='(')
  with pytest.raises(ValueError, match=r'permute=True: no layer with an N:M target'):
    oneshot.prune(fn, params, [xr], method='wanda', sparsity=0.5, permute=True)
  with pytest.raises(ValueError, match=r"nm=2:4: layer 'w' has 6 inputs, not divisible by M=4"):
    oneshot.permute_channels(
      lambda p, x: x @ p['w'], {'w': jnp.ones((6, 4))}, [jnp.ones((2, 6))], nm='2:4'
    )
