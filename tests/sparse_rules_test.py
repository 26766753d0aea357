"""jaxprune.sparse.static / set_ / rigl: mask updates against numpy, counts, moments, zeros."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxprune
from jaxprune import sparse


def _params(seed=0):
  rng = np.random.default_rng(seed)
  return {
    'a': {
      'kernel': jnp.asarray(rng.normal(size=(12, 20)), jnp.float32),
      'bias': jnp.asarray(rng.normal(size=(20,)), jnp.float32),
    },
    'b': {'kernel': jnp.asarray(rng.normal(size=(20, 8)), jnp.float32)},
  }


def _grads(params, seed):
  rng = np.random.default_rng(100 + seed)
  return jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)


def _reference_regrow(mask, weights, grow, n_drop):
  """Drop the n_drop kept entries of smallest |weights| (ties: higher index first), grow the
  n_drop highest |grow| among the entries not kept after the drop (ties: lower index first)."""
  mask, weights, grow = mask.reshape(-1), np.abs(weights.reshape(-1)), np.abs(grow.reshape(-1))
  active = np.flatnonzero(mask)
  kept = mask.copy()
  kept[active[np.lexsort((-active, weights[active]))][:n_drop]] = False
  others = np.flatnonzero(~kept)
  new = kept.copy()
  new[others[np.lexsort((others, -grow[others]))][:n_drop]] = True
  return new


@pytest.mark.parametrize('rule', ['rigl', 'set'])
def test_one_mask_update_against_numpy(rule):
  params = _params()
  adam = optax.adam(0.1)
  fn = sparse.rigl if rule == 'rigl' else sparse.set_
  tx = fn(adam, 0.75, end_step=8, update_freq=2, drop_fraction=0.5, distribution='uniform')
  state = tx.init(params)
  masks = {n: np.asarray(m) for n, m in jaxprune.named_leaves(sparse.get_masks(state))}
  assert {n: int(m.sum()) for n, m in masks.items()} == {'a/kernel': 60, 'b/kernel': 40}
  # Two steps without an update (steps 0 and 1), then the update at step 2.
  step = jax.jit(tx.update)
  for i in range(2):
    updates, state = step(_grads(params, i), state, params)
    params = optax.apply_updates(params, updates)
    for name, m in masks.items():
      np.testing.assert_array_equal(np.asarray(params[name.split('/')[0]]['kernel'])[~m], 0.0)
  grads = _grads(params, 10)
  old_inner = state.inner_state
  masked = {
    k: {kk: jnp.where(masks[f'{k}/kernel'], g, 0) if kk == 'kernel' else g for kk, g in v.items()}
    for k, v in grads.items()
  }
  ref_updates, ref_inner = jax.jit(adam.update)(masked, old_inner, params)
  assert int(state.step) == 2
  updates, new_state = step(grads, state, params)
  new_params = optax.apply_updates(params, updates)
  # Cosine decay: 0.5 * (1 + cos(pi * 2 / 8)) / 2, of 60 and 40 kept entries.
  fraction = np.float32(0.5) * (1 + np.cos(np.float32(np.pi) * np.float32(0.25))) / 2
  n_drops = {
    'a/kernel': int(np.floor(np.float32(60) * fraction)),
    'b/kernel': int(np.floor(np.float32(40) * fraction)),
  }
  assert n_drops == {'a/kernel': 25, 'b/kernel': 17}
  new_masks = dict(jaxprune.named_leaves(sparse.get_masks(new_state)))
  for name, old in masks.items():
    layer = name.split('/')[0]
    new = np.asarray(new_masks[name])
    assert new.sum() == old.sum()
    grown = new & ~old
    if rule == 'rigl':
      weights = np.asarray(params[layer]['kernel']) + np.asarray(ref_updates[layer]['kernel'])
      want = _reference_regrow(old, weights, np.asarray(grads[layer]['kernel']), n_drops[name])
      np.testing.assert_array_equal(new.reshape(-1), want)
    else:
      dropped = old & ~new
      assert dropped.sum() == grown.sum() <= n_drops[name]
    assert grown.sum() > 0
    w = np.asarray(new_params[layer]['kernel'])
    np.testing.assert_array_equal(w[~new], 0.0)
    np.testing.assert_array_equal(w[grown], 0.0)  # regrown weights start at zero
    stay = new & old
    want_w = np.asarray(params[layer]['kernel']) + np.asarray(ref_updates[layer]['kernel'])
    # Equal up to XLA's fusion of adam inside the larger jitted update (1 ulp).
    np.testing.assert_allclose(w[stay], want_w[stay], rtol=1e-6)
    for moment, ref in (('mu', ref_inner[0].mu), ('nu', ref_inner[0].nu)):
      got = np.asarray(getattr(new_state.inner_state[0], moment)[layer]['kernel'])
      np.testing.assert_array_equal(got[grown], 0.0)
      np.testing.assert_allclose(got[~grown], np.asarray(ref[layer]['kernel'])[~grown], rtol=1e-6)
  np.testing.assert_allclose(
    new_params['a']['bias'], params['a']['bias'] + ref_updates['a']['bias'], rtol=1e-6
  )


def _run(tx, steps, params=None):
  params = _params() if params is None else params
  state = tx.init(params)
  step = jax.jit(tx.update)
  history = []
  for i in range(steps):
    updates, state = step(_grads(params, i), state, params)
    params = optax.apply_updates(params, updates)
    masks = {n: np.asarray(m) for n, m in jaxprune.named_leaves(sparse.get_masks(state))}
    history.append((masks, params))
  return history, state


@pytest.mark.parametrize('rule', ['static', 'set', 'rigl'])
def test_counts_constant_and_masked_weights_zero(rule):
  adam = optax.chain(optax.add_decayed_weights(1e-2), optax.sgd(0.05, momentum=0.9))
  kwargs = (
    dict(distribution='erk')
    if rule == 'static'
    else dict(end_step=12, update_freq=3, distribution='erk')
  )
  tx = {'static': sparse.static, 'set': sparse.set_, 'rigl': sparse.rigl}[rule](adam, 0.8, **kwargs)
  history, _ = _run(tx, 16)
  density = sparse.densities(_params(), 0.8, 'erk')
  counts = {
    n: sparse.kept_count(math.prod(_params()[n.split('/')[0]]['kernel'].shape), d)
    for n, d in density.items()
  }
  changes = []
  for i, (masks, params) in enumerate(history):
    assert {n: int(m.sum()) for n, m in masks.items()} == counts
    for name, m in masks.items():
      np.testing.assert_array_equal(np.asarray(params[name.split('/')[0]]['kernel'])[~m], 0.0)
    if i:
      changes.append(any((m != history[i - 1][0][n]).any() for n, m in masks.items()))
  # Updates at steps 3, 6, 9 and 12 (history index = step); at 12 = end_step the cosine
  # drop fraction is 0, so the mask stays.
  want = [] if rule == 'static' else [3, 6, 9]
  assert [i for i, c in enumerate(changes, start=1) if c] == want


def test_set_is_random_and_seeded():
  kw = dict(end_step=10, update_freq=2, drop_fraction=0.5)
  tx = sparse.set_(optax.sgd(0.1), 0.7, seed=1, **kw)
  a, b = (_run(tx, 5)[0][-1][0] for _ in range(2))
  c = _run(sparse.set_(optax.sgd(0.1), 0.7, seed=2, **kw), 5)[0][-1][0]
  assert all((a[n] == b[n]).all() for n in a)
  assert any((a[n] != c[n]).any() for n in a)


def test_no_updates_after_end_step_and_reset_of_nested_state():
  tx = sparse.rigl(
    optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.1)),
    0.6,
    end_step=4,
    update_freq=2,
    distribution='uniform',
  )
  history, state = _run(tx, 9)
  masks = [h[0] for h in history]
  assert all((masks[4][n] == masks[i][n]).all() for i in range(4, 9) for n in masks[4])
  assert int(state.step) == 9


def test_reset_at_finds_param_shaped_subtrees():
  params = {'w': jnp.ones((2, 3)), 'v': jnp.ones((4,))}
  inner = optax.chain(optax.adam(0.1), optax.trace(0.9))
  state = jax.tree.map(lambda x: x + 1 if x.ndim else x, inner.init(params))
  grown = {'w': jnp.array([[True, False, False], [False, False, True]]), 'v': None}
  out = sparse.reset_at(state, params, grown)
  for tree in (out[0][0].mu, out[0][0].nu, out[1].trace):
    np.testing.assert_array_equal(tree['w'], [[0, 1, 1], [1, 1, 0]])
    np.testing.assert_array_equal(tree['v'], [1, 1, 1, 1])
  assert int(out[0][0].count) == 0


@pytest.mark.parametrize(
  'kwargs, message',
  [
    (dict(end_step=None), 'end_step=None'),
    (dict(end_step=10, update_freq=0), 'update_freq=0'),
    (dict(end_step=10, drop_fraction=1.0), 'drop_fraction=1.0'),
    (dict(end_step=10, drop_fraction_decay='linear'), "drop_fraction_decay='linear'"),
    (dict(end_step=10, sparsity=1.0), r'sparsity=1.0: must be in \[0, 1\)'),
    (dict(end_step=10, distribution='ER'), "distribution='ER'"),
  ],
)
def test_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    sparse.rigl(optax.sgd(0.1), **{'sparsity': 0.5, **kwargs})
  tx = sparse.static(optax.sgd(0.1), 0.5)
  with pytest.raises(ValueError, match='needs the params'):
    tx.update(_params(), tx.init(_params()))


RULES = {
  'static': lambda **kw: sparse.static(optax.sgd(0.1), 0.5, **kw),
  'set': lambda **kw: sparse.set_(optax.sgd(0.1), 0.5, end_step=10, update_freq=1, **kw),
  'rigl': lambda **kw: sparse.rigl(optax.sgd(0.1), 0.5, end_step=10, update_freq=1, **kw),
  'ste': lambda **kw: sparse.ste(optax.sgd(0.1), 0.5, **kw),
}


@pytest.mark.parametrize('rule', sorted(RULES))
def test_nan_gradients_keep_every_count(rule):
  """All-NaN gradients at a mask update: each leaf keeps its mask (and so its count), as
  the pruning transform skips non-finite updates."""
  tx = RULES[rule]()
  params = _params()
  state = tx.init(params)
  step = jax.jit(tx.update)
  _, state = step(_grads(params, 0), state, params)
  before = [int(m.sum()) for m in jax.tree.leaves(state.masks)]
  nan = jax.tree.map(lambda p: jnp.full_like(p, jnp.nan), params)
  for _ in range(3):
    _, state = step(nan, state, params)
  assert [int(m.sum()) for m in jax.tree.leaves(state.masks)] == before


@pytest.mark.parametrize('rule', sorted(RULES))
def test_bad_arguments_are_one_line_errors(rule):
  with pytest.warns(UserWarning, match=r"sparsity_map entry 'nothere' matches none of the sparse"):
    RULES[rule](sparsity_map={'nothere': 0.3}).init(_params())
  params = _params()
  tx = RULES[rule]()
  state = tx.init(params)
  grads = dict(params, b={'kernel': jnp.ones((8, 20))})
  with pytest.raises(ValueError, match=r"gradient of 'b/kernel' has shape \(8, 20\)"):
    tx.update(grads, state, params)


def test_wrong_optimizer_and_erk_power_are_named():
  with pytest.raises(TypeError, match='the first argument is the optimizer to wrap'):
    sparse.static(None, 0.5)
  with pytest.raises(TypeError, match='the first argument is the optimizer to wrap'):
    sparse.ste(None)
  for rule in (sparse.set_, sparse.rigl):
    with pytest.raises(ValueError, match='erk_power=nan: must be a finite number'):
      rule(optax.adam(1e-3), 0.5, end_step=10, distribution='erk', erk_power=float('nan')).init(
        _params()
      )
  with pytest.raises(ValueError, match='give a sparsity or an N:M pattern, not both'):
    sparse.ste(optax.sgd(0.1), 0.7, nm='2:4')


@pytest.mark.parametrize(
  'make',
  [
    lambda: sparse.static(optax.sgd(0.1), 0.5),
    lambda: sparse.set_(optax.sgd(0.1), 0.5, end_step=10),
    lambda: sparse.rigl(optax.sgd(0.1), 0.5, end_step=10),
    lambda: sparse.ste(optax.sgd(0.1), 0.5),
    lambda: sparse.ste(optax.sgd(0.1), nm='2:4'),
  ],
  ids=['static', 'set', 'rigl', 'ste', 'ste-nm'],
)
def test_integer_params_are_named_at_init(make):
  params = dict(_params(), b={'kernel': jnp.ones((20, 8), jnp.int32)})
  with pytest.raises(ValueError, match=r"^leaf 'b/kernel' has dtype int32: only real floating"):
    make().init(params)


def _bfloat16(tree):
  return jax.tree.map(lambda x: x.astype(jnp.bfloat16), tree)


def _is_none(x):
  return x is None


@pytest.mark.parametrize('rule', ['static', 'set', 'rigl'])
def test_bfloat16_pruned_weights_are_zero_and_kept_ones_the_optimizers(rule):
  """In bfloat16 the masked step rounds as `optax.apply_updates` does: pruned weights are
  exactly 0, kept ones exactly what the optimizer alone (run in a program of its own, on
  the gradient masked by the mask before the step) gives, and SET and RigL drop the kept
  weights of least stored magnitude."""
  inner = optax.sgd(0.05, momentum=0.9)
  kwargs = {} if rule == 'static' else dict(end_step=6, update_freq=2, drop_fraction=0.5)
  tx = {'static': sparse.static, 'set': sparse.set_, 'rigl': sparse.rigl}[rule](
    inner, 0.75, distribution='uniform', **kwargs
  )
  params = _bfloat16(_params())
  state = tx.init(params)
  params = sparse.apply_masks(params, state)
  step, alone = jax.jit(tx.update), jax.jit(inner.update)
  for i in range(6):
    grads = _bfloat16(_grads(params, i))
    masked = jax.tree.map(
      lambda m, g: g if m is None else jnp.where(m, g, 0), state.masks, grads, is_leaf=_is_none
    )
    want = optax.apply_updates(params, alone(masked, state.inner_state, params)[0])
    old = state.masks
    updates, state = step(grads, state, params)
    new = optax.apply_updates(params, updates)
    leaves = zip(
      *(jax.tree.leaves(t, is_leaf=_is_none) for t in (new, want, old, state.masks)), strict=True
    )
    for got, expected, before, after in leaves:
      assert got.dtype == jnp.bfloat16
      got, expected = np.asarray(got, np.float32), np.asarray(expected, np.float32)
      if after is None:
        np.testing.assert_array_equal(got, expected)
        continue
      before, after = np.asarray(before), np.asarray(after)
      np.testing.assert_array_equal(got[~after], 0.0)
      np.testing.assert_array_equal(got[before & after], expected[before & after])
      if rule != 'static' and i in (2, 4):  # a mask update: the drop ranks stored weights
        fraction = sparse.drop_fraction_at(i, 0.5, 0, 6)
        n_drop = int(jnp.floor(jnp.float32(before.sum()) * fraction))
        active = np.flatnonzero(before)
        magnitudes = np.abs(expected).reshape(-1)[active]
        lowest = np.zeros(before.size, bool)
        lowest[active[np.lexsort((-active, magnitudes))][:n_drop]] = True
        lowest = lowest.reshape(before.shape)
        assert n_drop > 0 and not (before & ~after & ~lowest).any()
        assert after[before & ~lowest].all()
    params = new


def test_bfloat16_ste_params_are_the_masked_dense_weights():
  inner = optax.sgd(0.05, momentum=0.9)
  tx = sparse.ste(inner, 0.75)
  params = _bfloat16(_params())
  state = tx.init(params)
  step, alone = jax.jit(tx.update), jax.jit(inner.update)
  dense = params
  for i in range(4):
    grads = _bfloat16(_grads(params, i))
    dense = optax.apply_updates(dense, alone(grads, state.inner_state, dense)[0])
    updates, state = step(grads, state, params)
    params = optax.apply_updates(params, updates)
    for name in ('a', 'b'):
      got_dense = np.asarray(state.dense[name]['kernel'], np.float32)
      np.testing.assert_array_equal(got_dense, np.asarray(dense[name]['kernel'], np.float32))
      mask = np.asarray(state.masks[name]['kernel'])
      np.testing.assert_array_equal(
        np.asarray(params[name]['kernel'], np.float32), np.where(mask, got_dense, 0.0)
      )


@pytest.mark.parametrize('rule', sorted(RULES))
def test_get_masks_is_a_tree_like_params_as_jaxprune_get_masks(rule):
  params = _params()
  state = RULES[rule]().init(params)
  masks = sparse.get_masks((state,))
  assert masks['a']['bias'] is None
  assert [name for name, _ in jaxprune.named_leaves(masks)] == ['a/kernel', 'b/kernel']
  assert masks['a']['kernel'].shape == (12, 20) and masks['a']['kernel'].dtype == jnp.bool_
  masked = jaxprune.apply_masks(params, masks)  # the core takes it as it is
  for a, b in zip(
    jax.tree.leaves(masked), jax.tree.leaves(sparse.apply_masks(params, state)), strict=True
  ):
    np.testing.assert_array_equal(a, b)


def test_each_rule_takes_exactly_the_options_of_sparse_training():
  """`static`, `set_` and `rigl` hand their arguments to `sparse_training` as `**locals()`:
  each must declare only keywords that it takes (`rule` is each one's own)."""
  import inspect

  from jaxprune import sparse

  full = inspect.signature(sparse.sparse_training).parameters
  for rule in (sparse.static, sparse.set_, sparse.rigl):
    params = inspect.signature(rule).parameters
    assert set(params) <= set(full) - {'rule'}, rule.__name__
    for name, param in params.items():
      assert param.kind == full[name].kind, (rule.__name__, name)
