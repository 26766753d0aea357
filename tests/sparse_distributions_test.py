"""jaxprune.sparse: which leaves are sparse and their densities (uniform, ERK, regex maps)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxprune import sparse

SHAPES = {
  'conv1/kernel': (3, 3, 1, 16),
  'conv2/kernel': (3, 3, 16, 32),
  'dense/kernel': (128, 64),
  'out/kernel': (64, 10),
}


def _params(shapes=SHAPES):
  params = {}
  for name, shape in shapes.items():
    layer, leaf = name.split('/')
    params.setdefault(layer, {})[leaf] = jax.ShapeDtypeStruct(shape, jnp.float32)
    params[layer]['bias'] = jax.ShapeDtypeStruct(shape[-1:], jnp.float32)
  return params


def _erk_reference(shapes, sparsity):
  """Evci et al. 2020: density_l = eps * sum(shape_l) / prod(shape_l), solved for eps over the
  non-dense layers; layers are made dense largest-raw-first until no density exceeds 1."""
  names = sorted(shapes, key=lambda n: -sum(shapes[n]) / math.prod(shapes[n]))
  sizes = np.array([math.prod(shapes[n]) for n in names], np.float64)
  raw = np.array([sum(shapes[n]) for n in names], np.float64) / sizes
  for dense in range(len(names)):
    budget = (1 - sparsity) * sizes.sum() - sizes[:dense].sum()
    eps = budget / (raw[dense:] * sizes[dense:]).sum()
    if eps * raw[dense:].max() <= 1:
      return {n: 1.0 if i < dense else eps * raw[i] for i, n in enumerate(names)}
  raise AssertionError('no valid eps')


def test_erk_by_hand():
  # raw 20/100 = 0.2 and 25/100 = 0.25; budget 0.5 * 200 = 100 = eps * (20 + 25).
  got = sparse.erk_densities({'a': (10, 10), 'b': (20, 5)}, 0.5)
  assert got['a'] == pytest.approx(0.2 * 100 / 45)
  assert got['b'] == pytest.approx(0.25 * 100 / 45)


@pytest.mark.parametrize('sparsity', [0.5, 0.8, 0.9, 0.95])
def test_erk_matches_formula_and_budget(sparsity):
  got = sparse.densities(_params(), sparsity, 'erk')
  want = _erk_reference(SHAPES, sparsity)
  assert set(got) == set(SHAPES)  # biases are not sparse
  for name in SHAPES:
    assert got[name] == pytest.approx(want[name], rel=1e-12)
    assert 0 < got[name] <= 1
  kept = sum(got[n] * math.prod(s) for n, s in SHAPES.items())
  assert kept == pytest.approx((1 - sparsity) * sum(math.prod(s) for s in SHAPES.values()))
  # conv1 (raw 23/144) turns dense below S = 1 - 343 / (0.16 * 13584) ~ 0.84: at 0.8, the
  # first eps is 0.2 * 13584 / 343 = 7.92 and 7.92 * 23 / 144 = 1.27 > 1.
  assert (got['conv1/kernel'] == 1.0) == (sparsity <= 0.8)


def test_uniform_and_map():
  got = sparse.densities(_params(), 0.9, sparsity_map={'^conv1/': 0.5, 'out': 0.0})
  assert got == {
    'conv1/kernel': 0.5,
    'conv2/kernel': pytest.approx(0.1),
    'dense/kernel': pytest.approx(0.1),
    'out/kernel': 1.0,
  }
  erk = sparse.densities(_params(), 0.9, 'erk', sparsity_map={'conv1': 0.3})
  assert erk['conv1/kernel'] == pytest.approx(0.7)
  rest = {n: s for n, s in SHAPES.items() if n != 'conv1/kernel'}
  for name, density in _erk_reference(rest, 0.9).items():
    assert erk[name] == pytest.approx(density)


def test_kept_count():
  assert sparse.kept_count(144, 0.1) == 14  # round(14.4)
  assert sparse.kept_count(10, 0.25) == 2  # round(2.5), half to even
  assert sparse.kept_count(10, 0.001) == 1
  assert sparse.kept_count(10, 1.0) == 10


@pytest.mark.parametrize(
  'kwargs, message',
  [
    (dict(sparsity=1.0), r'sparsity=1.0: must be in \[0, 1\)'),
    (dict(sparsity=0.5, distribution='er'), "distribution='er'"),
    (dict(sparsity=0.5, sparsity_map={'conv': 0.5, 'kernel': 0.2}), 'matches several'),
    (dict(sparsity=0.5, sparsity_map={'conv': 1.5}), r'must be in \[0, 1\)'),
    (dict(sparsity=0.5, sparsity_map={'(': 0.5}), 'invalid regex'),
    (dict(sparsity=0.5, weight_name_regex='nothing'), 'no leaf is sparse'),
  ],
)
def test_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    sparse.densities(_params(), **kwargs)


def test_select_primitives_against_numpy():
  rng = np.random.default_rng(0)
  # Ties: scores drawn from few values. The lower flat index ranks higher among equals
  # (lax.top_k's order): of equal drop scores the higher index is dropped first, of equal
  # grow scores the lower index grows first.
  mask = np.zeros(60, bool)
  mask[rng.choice(60, 25, replace=False)] = True
  drop = rng.integers(0, 4, 60).astype(np.float32)
  grow = rng.integers(0, 4, 60).astype(np.float32)
  for n_drop in (0, 3, 7):
    got = np.asarray(
      jax.jit(sparse.drop_and_grow, static_argnums=4)(
        jnp.asarray(mask.reshape(6, 10)),
        jnp.asarray(drop.reshape(6, 10)),
        jnp.asarray(grow.reshape(6, 10)),
        jnp.int32(n_drop),
        7,
      )
    ).reshape(-1)
    active = np.flatnonzero(mask)
    by_drop = active[np.lexsort((-active, drop[active]))]  # ascending score, higher index
    kept = mask.copy()
    kept[by_drop[:n_drop]] = False
    others = np.flatnonzero(~kept)
    by_grow = others[np.lexsort((others, -grow[others]))]
    want = kept.copy()
    want[by_grow[:n_drop]] = True
    np.testing.assert_array_equal(got, want)
    assert got.sum() == 25
  counts = [int(sparse.random_mask(jax.random.PRNGKey(i), (7, 9), 20).sum()) for i in range(3)]
  assert counts == [20, 20, 20]
  np.testing.assert_array_equal(
    sparse.top_k_mask(jnp.array([1.0, 3.0, 3.0, 2.0, 3.0]), 2), [False, True, True, False, False]
  )


def test_drop_fraction_cosine():
  got = [float(sparse.drop_fraction_at(t, 0.3, 0, 100)) for t in (0, 25, 50, 100, 150)]
  want = [0.3 * (1 + math.cos(math.pi * min(t, 100) / 100)) / 2 for t in (0, 25, 50, 100, 150)]
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  assert float(sparse.drop_fraction_at(70, 0.3, 0, 100, 'constant')) == pytest.approx(0.3)
