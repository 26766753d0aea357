"""DSnoT's mask fix-up (`oneshot.prune(dsnot=)`) against a loop-by-loop numpy reference of
the official code's rule (github.com/zyxxmu/DSnoT, `prune_DSnoT`), and its guarantees: each
row keeps its count of zeros, N:M stays N:M, no row reconstructs worse."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from oneshot_references import conv_patches, wanda_mask

import jaxprune
from jaxprune import oneshot


def _setup(k=16, out=8, n=96, seed=0):
  """Inputs with nonzero, uneven means (the error DSnoT moves is the mean's) in two batches,
  and (inputs, outputs) weights."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, k)) * np.exp(0.5 * rng.normal(size=k)) + rng.normal(size=k)
  w = rng.normal(size=(k, out)).astype(np.float32)
  batches = [jnp.asarray(x[: n // 2], jnp.float32), jnp.asarray(x[n // 2 :], jnp.float32)]
  return x.astype(np.float32).astype(np.float64), w, batches


def _linear(params, x):
  return x @ params['w']


def dsnot_reference(w, new, keep, x, nm, max_cycle, threshold):
  """DSnoT on (outputs, inputs) weights, one row and one swap at a time, in float64; each
  row keeps its swaps up to the one after which `||(W_i - W'_i) X||^2` was least."""
  mean, var = x.mean(0), x.var(0)
  norm, gram = np.sqrt((x**2).sum(0)), x.T @ x
  out_w, out_keep = new.astype(np.float64).copy(), keep.copy()
  for i in range(len(w)):
    v, kept = new[i].astype(np.float64).copy(), keep[i].copy()
    touched = np.zeros(len(v), bool)
    err = np.sum((w[i] - v) * mean)
    sign0 = np.sign(err)
    best = (w[i] - v) @ gram @ (w[i] - v)
    for _ in range(max_cycle):
      if abs(err) <= threshold:
        break
      s = np.sign(err)
      grow = [
        j
        for j in range(len(v))
        if not kept[j]
        and not touched[j]
        and s * w[i, j] * mean[j] > 0
        and (
          nm is None
          or any(kept[q] and not touched[q] for q in range(j - j % nm[1], j - j % nm[1] + nm[1]))
        )
      ]
      if not grow:
        break
      j = max(grow, key=lambda j: (s * w[i, j] * mean[j] / var[j], -j))
      if nm is None:
        cut = [q for q in range(len(v)) if kept[q] and not touched[q] and s * v[q] * mean[q] < 0]
      else:
        group = range(j - j % nm[1], j - j % nm[1] + nm[1])
        cut = [q for q in group if kept[q] and not touched[q]]
      if not cut:
        break
      p = min(cut, key=lambda q: (abs(v[q]) * norm[q], q))
      after = err + v[p] * mean[p] - w[i, j] * mean[j]
      if nm is not None and np.sign(after) != sign0:
        break
      v[j], v[p] = w[i, j], 0.0
      kept[j], kept[p] = True, False
      touched[j] = touched[p] = True
      err = after
      error = (w[i] - v) @ gram @ (w[i] - v)
      if error < best:
        best, out_w[i], out_keep[i] = error, v.copy(), kept.copy()
  return out_w, out_keep


@pytest.mark.parametrize(('sparsity', 'nm'), [(0.5, None), (None, (2, 4))])
def test_wanda_then_dsnot_is_the_reference(sparsity, nm):
  x, w, batches = _setup()
  keep = wanda_mask(w.T, x, sparsity, nm)
  new = np.where(keep, w.T, 0)
  expected_w, expected_keep = dsnot_reference(w.T, new, keep, x, nm, 50, 1e-3)
  assert (expected_keep != keep).any()  # the reference swapped something
  pruned, masks = oneshot.prune(
    _linear,
    {'w': jnp.asarray(w)},
    batches,
    method='wanda',
    sparsity=sparsity,
    nm=nm,
    dsnot=oneshot.DSnoT(threshold=1e-3),
  )
  np.testing.assert_array_equal(np.asarray(masks['w']), expected_keep.T)
  np.testing.assert_allclose(np.asarray(pruned['w']), expected_w.T, rtol=1e-6)


def test_zero_cycles_change_nothing():
  _, w, batches = _setup()
  for method in oneshot.METHODS:
    plain = oneshot.prune(_linear, {'w': jnp.asarray(w)}, batches, method=method, sparsity=0.5)
    fixed = oneshot.prune(
      _linear,
      {'w': jnp.asarray(w)},
      batches,
      method=method,
      sparsity=0.5,
      dsnot=oneshot.DSnoT(max_cycle=0),
    )
    np.testing.assert_array_equal(np.asarray(plain[1]['w']), np.asarray(fixed[1]['w']))


@pytest.mark.parametrize('method', ['magnitude', 'wanda', 'sparsegpt', 'ria'])
@pytest.mark.parametrize('target', [0.6, '2:4'])
def test_no_row_worse_same_counts_and_the_mean_error_smaller(method, target):
  x, w, batches = _setup(k=32, out=16, seed=4)
  kwargs = {'nm': target} if isinstance(target, str) else {'sparsity': target}
  params = {'w': jnp.asarray(w)}
  plain, plain_masks = oneshot.prune(_linear, params, batches, method=method, **kwargs)
  fixed, masks = oneshot.prune(_linear, params, batches, method=method, dsnot=True, **kwargs)
  before = np.asarray(plain['w'], np.float64)
  after = np.asarray(fixed['w'], np.float64)
  row_before = ((x @ (w - before)) ** 2).sum(0)
  row_after = ((x @ (w - after)) ** 2).sum(0)
  assert np.all(row_after <= row_before * (1 + 1e-5)), (row_before, row_after)
  np.testing.assert_array_equal(np.asarray(masks['w']).sum(0), np.asarray(plain_masks['w']).sum(0))
  np.testing.assert_array_equal(after == 0, ~np.asarray(masks['w']))
  if isinstance(target, str):
    assert bool(jaxprune.is_nm_sparse(fixed['w'], 2, 4))  # groups along the inputs
  if method != 'sparsegpt':
    # The expected error per row |sum_j (W - W')_ij E[x_j]| falls in all.
    mean = x.mean(0)
    assert np.abs(mean @ (w - after)).sum() < np.abs(mean @ (w - before)).sum()


@pytest.mark.parametrize(
  ('dsnot', 'match'),
  [
    (oneshot.DSnoT(max_cycle=-1), r'dsnot\.max_cycle=-1'),
    (oneshot.DSnoT(max_cycle=2.5), r'dsnot\.max_cycle=2\.5'),
    (oneshot.DSnoT(threshold=-1.0), r'dsnot\.threshold=-1\.0'),
    (3, r'dsnot=3: give True, False or oneshot\.DSnoT'),
  ],
)
def test_bad_dsnot_arguments_are_one_line_errors(dsnot, match):
  _, w, batches = _setup()
  with pytest.raises(ValueError, match=match) as info:
    oneshot.prune(
      _linear, {'w': jnp.asarray(w)}, batches, method='wanda', sparsity=0.5, dsnot=dsnot
    )
  assert '\n' not in str(info.value)


def test_grouped_convolution_rows_use_their_groups_inputs():
  rng = np.random.default_rng(6)
  x = rng.normal(size=(4, 6, 6, 8)) + rng.normal(size=8)  # NHWC, uneven channel means
  kernel = rng.normal(size=(3, 3, 4, 6)).astype(np.float32)  # HWIO, 2 groups of 4 inputs

  def conv(params, x):
    return jax.lax.conv_general_dilated(
      x,
      params['k'],
      (1, 1),
      'VALID',
      dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
      feature_group_count=2,
    )

  batches = [jnp.asarray(x, jnp.float32)]
  params = {'k': jnp.asarray(kernel)}
  plain, plain_masks = oneshot.prune(conv, params, batches, method='magnitude', sparsity=0.5)
  fixed, masks = oneshot.prune(conv, params, batches, method='magnitude', sparsity=0.5, dsnot=True)
  patches = conv_patches(x, (3, 3), 1, ((0, 0), (0, 0)), 1, 2)  # (groups, tokens, 36)

  def row_errors(k):
    w = np.transpose(np.asarray(k, np.float64), (3, 0, 1, 2)).reshape(6, 36)
    d = np.transpose(kernel.astype(np.float64), (3, 0, 1, 2)).reshape(6, 36) - w
    return np.concatenate([((patches[g] @ d[3 * g : 3 * g + 3].T) ** 2).sum(0) for g in (0, 1)])

  before, after = row_errors(plain['k']), row_errors(fixed['k'])
  assert np.all(after <= before * (1 + 1e-5)) and after.sum() < before.sum()
  np.testing.assert_array_equal(
    np.asarray(masks['k']).sum((0, 1, 2)), np.asarray(plain_masks['k']).sum((0, 1, 2))
  )


def test_a_scanned_stack_gets_what_the_unrolled_layers_get():
  rng = np.random.default_rng(7)
  stack = jnp.asarray(rng.normal(size=(3, 16, 16)) / 4, jnp.float32)
  batches = [jnp.asarray(rng.normal(size=(64, 16)) + 1, jnp.float32)]

  def scanned(p, x):
    return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w) + 0.5, None), x, p['w'])[0]

  def unrolled(p, x):
    for i in range(3):
      x = jnp.tanh(x @ p[f'w{i}']) + 0.5
    return x

  _, stacked = oneshot.prune(
    scanned, {'w': stack}, batches, method='wanda', sparsity=0.5, dsnot=True
  )
  _, separate = oneshot.prune(
    unrolled,
    {f'w{i}': stack[i] for i in range(3)},
    batches,
    method='wanda',
    sparsity=0.5,
    dsnot=True,
  )
  for i in range(3):
    np.testing.assert_array_equal(np.asarray(stacked['w'][i]), np.asarray(separate[f'w{i}']))
  plain, _ = oneshot.prune(scanned, {'w': stack}, batches, method='wanda', sparsity=0.5)
  assert (np.asarray(plain['w']) != np.asarray(stacked['w'])).any()  # DSnoT swapped some
