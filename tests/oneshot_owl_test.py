"""OWL's layer-wise sparsities (`oneshot.prune(owl=)`) against the formula of the paper's
code (github.com/luuyin/OWL, `prune_wanda_outlier`), written here in numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from oneshot_references import row_mask

from jaxprune import oneshot
from jaxprune.oneshot import _owl

TARGET = 0.6


def _inputs(n=96, k=16, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, k)) * np.exp(rng.normal(size=k))
  return x, [jnp.asarray(x[: n // 2], jnp.float32), jnp.asarray(x[n // 2 :], jnp.float32)]


def _weights(shapes, seed=1):
  """Weights whose outliers differ by layer: heavy tails (Student t) of growing weight."""
  rng = np.random.default_rng(seed)
  out = {}
  for i, shape in enumerate(shapes):
    heavy = rng.standard_t(df=1.5 + 2 * i, size=shape)
    out[f'w{i}'] = (0.3 * heavy).astype(np.float32)
  return out


def _chain(params, x):
  for i in range(len(params)):
    x = jnp.tanh(x @ params[f'w{i}'])
  return x


def _dense_inputs(x, weights):
  """Each layer's input in the dense model (float64), as OWL's code measures them."""
  found = []
  for i in range(len(weights)):
    found.append(x)
    x = np.tanh(x @ weights[f'w{i}'].astype(np.float64))
  return found


def _outlier_ratio(w, x, m):
  """The share of Wanda scores above m times their mean, w as (inputs, outputs)."""
  scores = np.abs(w.T.astype(np.float64)) * np.sqrt((x**2).sum(0))
  return np.mean(scores > m * scores.mean())


def _official(ratios, target, lam):
  """`prune_wanda_outlier`'s layer sparsities: 1 - (Dn - mean(Dn) + 1 - target)."""
  ratios = np.asarray(ratios) * 100  # its ratios are percentages; the scaling drops them
  scaled = (ratios - ratios.min()) * (1 / (ratios.max() - ratios.min()) * lam * 2)
  density = scaled - np.mean(scaled) + (1 - target)
  return 1 - density


def _zeros(masks):
  return {name: int((~np.asarray(mask)).sum()) for name, mask in masks.items()}


def test_equal_layers_take_the_official_sparsities_and_wandas_masks():
  x, batches = _inputs()
  weights = _weights([(16, 16)] * 4, seed=2)
  xs = _dense_inputs(x, weights)
  ratios = [_outlier_ratio(weights[f'w{i}'], xs[i], 3) for i in range(4)]
  assert len(set(ratios)) == 4, ratios  # the layers differ
  expected = _official(ratios, TARGET, 0.08)
  params = jax.tree.map(jnp.asarray, weights)
  _, masks, report = oneshot.prune_with_report(
    _chain,
    params,
    batches,
    method='wanda',
    sparsity=TARGET,
    owl=oneshot.OWL(m=3),
    sequential=False,
  )
  got = {layer.name: layer.sparsity for layer in report.layers}
  for i in range(4):
    # Whole counts: within one weight of the official (equal sizes: the same mean).
    assert abs(got[f'w{i}'] - expected[i]) <= 1 / 256 + 1e-12, (got, expected)
    np.testing.assert_allclose(report.layers[i].outliers, ratios[i], atol=1e-6)
    # Wanda's own masks at that layer's sparsity (the inputs are the dense model's).
    scores = np.abs(weights[f'w{i}'].T) * np.sqrt((xs[i] ** 2).sum(0))
    np.testing.assert_array_equal(
      np.asarray(masks[f'w{i}']), row_mask(scores, got[f'w{i}'], None).T
    )
  assert sum(_zeros(masks).values()) == round(TARGET * 4 * 256)
  # More outliers, lower sparsity; the spread is 2 * lambda, up to the rounding.
  order = np.argsort(ratios)
  assert [got[f'w{i}'] for i in order] == sorted(got.values(), reverse=True)
  assert abs(max(got.values()) - min(got.values()) - 0.16) <= 2 / 256


@pytest.mark.slow  # every method: about 6 s
def test_the_weighted_mean_is_the_target_for_layers_of_different_sizes():
  x, batches = _inputs()
  weights = _weights([(16, 64), (64, 8), (8, 40)])
  xs = _dense_inputs(x, weights)
  ratios = np.array([_outlier_ratio(weights[f'w{i}'], xs[i], 5) for i in range(3)])
  sizes = np.array([16 * 64, 64 * 8, 8 * 40])
  scaled = (ratios - ratios.min()) / (ratios.max() - ratios.min()) * 0.16
  # target + c - Dn with c the weighted mean of Dn, so that sum(size * sparsity) = target * N.
  expected = TARGET + np.sum(scaled * sizes) / sizes.sum() - scaled
  for method in oneshot.METHODS:
    _, masks, report = oneshot.prune_with_report(
      _chain, jax.tree.map(jnp.asarray, weights), batches, method=method, sparsity=TARGET, owl=True
    )
    zeros = _zeros(masks)
    assert sum(zeros.values()) == round(TARGET * sizes.sum()), method
    for i, layer in enumerate(report.layers):
      assert abs(zeros[f'w{i}'] - expected[i] * sizes[i]) < 1, (method, layer, expected)
      assert abs(layer.sparsity - zeros[f'w{i}'] / sizes[i]) < 1e-6
  # The unweighted mean of the official code would miss the target here.
  official = _official(ratios, TARGET, 0.08)
  assert abs(np.sum(official * sizes) / sizes.sum() - TARGET) > 1e-3


def test_a_wide_lambda_is_clipped_and_still_meets_the_target():
  x, batches = _inputs()
  weights = _weights([(16, 64), (64, 8), (8, 40)])
  lam = min(0.3, 1 - 0.3)
  _, masks, report = oneshot.prune_with_report(
    _chain,
    jax.tree.map(jnp.asarray, weights),
    batches,
    method='magnitude',
    sparsity=0.3,
    owl=oneshot.OWL(m=3, lam=lam),
  )
  assert sum(_zeros(masks).values()) == round(0.3 * (1024 + 512 + 320))
  assert all(0 <= layer.sparsity < 1 for layer in report.layers)


def test_clipped_sparsities_worked_by_hand():
  # Dn = (0.6, 0, 0): 0.3 + 0.06 - 0.6 < 0 is clipped to 0, the other two take the 300
  # pruned weights: 900 * s = 300, s = 1/3: 266.67 and 33.33, the larger remainder rounded up.
  got = _owl.sparsities(np.array([1.0, 0, 0]), np.array([100, 800, 100]), 0.3, 0.3)
  np.testing.assert_allclose(got, [0, 267 / 800, 33 / 100])
  # Dn = (0, 0.6, 0.6) at 0.7: 1.1 is clipped to 99 of 100, the others take 111 of 200
  # (55.5 each: the tie goes to the earlier layer).
  got = _owl.sparsities(np.array([0.0, 1, 1]), np.array([100, 100, 100]), 0.7, 0.3)
  np.testing.assert_allclose(got, [0.99, 0.56, 0.55])
  # Equal ratios: the target everywhere.
  np.testing.assert_allclose(_owl.sparsities(np.ones(3), np.full(3, 10), 0.5, 0.1), [0.5] * 3)


def test_overridden_layers_keep_their_target():
  _, batches = _inputs()
  params = jax.tree.map(jnp.asarray, _weights([(16, 16)] * 3))
  _, masks, report = oneshot.prune_with_report(
    _chain, params, batches, method='wanda', sparsity=0.5, owl=True, overrides={'w2': '2:4'}
  )
  zeros = _zeros(masks)
  assert zeros['w2'] == 128 and report.layers[2].outliers is None
  assert zeros['w0'] + zeros['w1'] == 256 and zeros['w0'] != zeros['w1']


def test_stacked_layers_each_get_a_sparsity():
  _, batches = _inputs(k=8)
  rng = np.random.default_rng(3)
  stack = jnp.asarray(rng.standard_t(df=2, size=(3, 8, 8)) * np.array([1, 3, 9])[:, None, None])

  def fn(p, x):
    return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, p['w'])[0]

  _, masks, report = oneshot.prune_with_report(
    fn, {'w': stack.astype(jnp.float32)}, batches, method='wanda', sparsity=0.5, owl=True
  )
  assert [layer.name for layer in report.layers] == ['w[0]', 'w[1]', 'w[2]']
  assert int((~masks['w']).sum()) == 96
  assert all(layer.outliers is not None for layer in report.layers)


@pytest.mark.parametrize(
  ('kwargs', 'match'),
  [
    ({'sparsity': 0.6, 'owl': oneshot.OWL(lam=0.5)}, r'owl\.lam=0\.5: must be in .*\[0, 0\.4\]'),
    ({'sparsity': 0.05, 'owl': oneshot.OWL(lam=0.08)}, r'owl\.lam=0\.08: .*\[0, 0\.05\]'),
    ({'sparsity': 0.6, 'owl': oneshot.OWL(lam=-0.1)}, r'owl\.lam=-0\.1'),
    ({'sparsity': 0.6, 'owl': oneshot.OWL(m=0)}, r'owl\.m=0'),
    ({'nm': '2:4', 'owl': True}, r"owl=.*not nm='2:4'"),
    ({'sparsity': 0.6, 'owl': 'yes'}, r"owl='yes': give True, False or oneshot\.OWL"),
    ({'sparsity': 0.6, 'owl': oneshot.OWL(groups='(')}, r"owl\.groups: invalid regex '\('"),
    ({'sparsity': 0.6, 'owl': oneshot.OWL(groups='(')}, r"owl\.groups: invalid regex '\('"),
  ],
)
def test_bad_owl_arguments_are_one_line_errors(kwargs, match):
  _, batches = _inputs()
  params = jax.tree.map(jnp.asarray, _weights([(16, 16)] * 2))
  with pytest.raises(ValueError, match=match) as info:
    oneshot.prune(_chain, params, batches, method='wanda', **kwargs)
  assert '\n' not in str(info.value)


def test_groups_share_one_ratio_and_sparsity_as_the_official_blocks_do():
  x, batches = _inputs()
  weights = _weights([(16, 16)] * 4, seed=2)
  xs = _dense_inputs(x, weights)
  # Blocks {w0, w1} and {w2, w3}: each block's scores together, its mean, its outliers.
  ratios = []
  for block in ((0, 1), (2, 3)):
    scores = np.concatenate(
      [(np.abs(weights[f'w{i}'].T) * np.sqrt((xs[i] ** 2).sum(0))).ravel() for i in block]
    )
    ratios.append(np.mean(scores > 3 * scores.mean()))
  assert ratios[0] != ratios[1]
  expected = _official(ratios, TARGET, 0.08)  # two blocks of equal size

  def blocks(p, x):
    return _chain({**p['b0'], **p['b1']}, x)

  _, masks, report = oneshot.prune_with_report(
    blocks,
    {
      'b0': {f'w{i}': jnp.asarray(weights[f'w{i}']) for i in (0, 1)},
      'b1': {f'w{i}': jnp.asarray(weights[f'w{i}']) for i in (2, 3)},
    },
    batches,
    method='wanda',
    sparsity=TARGET,
    owl=oneshot.OWL(m=3, groups=r'^b\d/'),
    sequential=False,
  )
  zeros = {
    name.split('/')[1]: count
    for name, count in _zeros(
      {f'{b}/{w}': mask for b, ws in masks.items() for w, mask in ws.items()}
    ).items()
  }
  for block, want, ratio in zip(((0, 1), (2, 3)), expected, ratios, strict=True):
    assert sum(zeros[f'w{i}'] for i in block) == round(want * 512)
    assert abs(zeros[f'w{block[0]}'] - zeros[f'w{block[1]}']) <= 1  # shared evenly
    for i in block:
      np.testing.assert_allclose(report.layers[i].outliers, ratio, atol=1e-6)
  assert sum(zeros.values()) == round(TARGET * 1024)
