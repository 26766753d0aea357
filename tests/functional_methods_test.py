"""Tests for jaxprune.methods: the per-array pruning rules (torch.nn.utils.prune semantics)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxprune import methods


def reference_prune_lowest(scores, amount, previous=None):
  """Slow, obviously correct: rank alive entries by (score desc, index asc), keep the first."""
  flat = np.asarray(scores, np.float64).reshape(-1)
  alive = np.ones(flat.shape, bool) if previous is None else np.asarray(previous).reshape(-1)
  alive_idx = [i for i in range(flat.size) if alive[i]]
  n_prune = amount if isinstance(amount, int) else round(amount * len(alive_idx))
  key = lambda i: (-(np.inf if np.isnan(flat[i]) else flat[i]), i)
  ranked = sorted(alive_idx, key=key)
  keep = np.zeros(flat.size, bool)
  keep[ranked[: len(alive_idx) - n_prune]] = True
  return keep.reshape(np.shape(scores))


def test_prune_lowest_by_hand():
  scores = jnp.array([3.0, 1.0, 2.0, 2.0, 0.5, 1.0])
  # Two lowest: 0.5 (index 4), then the tie 1.0 at indices 1 and 5: the higher index goes.
  np.testing.assert_array_equal(methods.prune_lowest(scores, 2), [1, 1, 1, 1, 0, 0])
  # Fraction 0.5 of 6 = 3 entries: 0.5, 1.0 (idx 5), 1.0 (idx 1).
  np.testing.assert_array_equal(methods.prune_lowest(scores, 0.5), [1, 0, 1, 1, 0, 0])
  np.testing.assert_array_equal(methods.prune_lowest(scores, 0), [1] * 6)
  np.testing.assert_array_equal(methods.prune_lowest(scores, 1.0), [0] * 6)
  np.testing.assert_array_equal(methods.prune_lowest(scores, 6), [0] * 6)


def test_fraction_rounds_half_to_even_like_torch():
  scores = jnp.arange(10.0)
  # round(0.25 * 10) = round(2.5) = 2; round(0.75 * 10) = round(7.5) = 8; round(0.26 * 10) = 3.
  assert int(jnp.sum(~methods.prune_lowest(scores, 0.25))) == 2
  assert int(jnp.sum(~methods.prune_lowest(scores, 0.75))) == 8
  assert int(jnp.sum(~methods.prune_lowest(scores, 0.26))) == 3


@pytest.mark.slow
@pytest.mark.parametrize(
  'size, amount', [(45, 0.7), (10, 0.25), (10, 0.75), (1001, 0.3), (7, 0.5), (200, 0.145)]
)
def test_counts_under_jit_with_traced_masks_are_torchs(size, amount):
  # Python's float64 round(amount * n), half to even: 45 * 0.7 = 31.499999999999996 -> 31,
  # where float32 gives 31.5 -> 32.
  expected = round(amount * size)
  prune = jax.jit(lambda s, p: methods.prune_lowest(s, amount, p))
  keep = prune(jnp.arange(float(size)), jnp.ones(size, bool))
  assert int(jnp.sum(~keep)) == expected
  # Relative to the entries still unpruned (traced): 0.7 of the 45 alive of 50.
  previous = jnp.arange(size + 5) >= 5
  keep = prune(jnp.arange(float(size + 5)), previous)
  assert int(jnp.sum(~keep)) == 5 + expected
  batched = jax.vmap(lambda p: methods.prune_lowest(jnp.arange(float(size)), amount, p))
  assert jnp.sum(~batched(jnp.ones((2, size), bool)), axis=1).tolist() == [expected] * 2


def test_amount_is_relative_to_unpruned_entries():
  scores = jnp.arange(1.0, 11.0)  # 1..10
  previous = jnp.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1], bool)  # 5..10 alive
  # 0.5 of the 6 alive = 3: 5, 6, 7 go; 1..4 stay pruned.
  np.testing.assert_array_equal(
    methods.prune_lowest(scores, 0.5, previous), [0, 0, 0, 0, 0, 0, 0, 1, 1, 1]
  )
  np.testing.assert_array_equal(
    methods.prune_lowest(scores, 1, previous), [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
  )


def test_pruned_entries_never_come_back_even_with_high_scores():
  scores = jnp.array([100.0, 1.0, 2.0, 3.0])
  previous = jnp.array([False, True, True, True])
  np.testing.assert_array_equal(methods.prune_lowest(scores, 1, previous), [0, 0, 1, 1])


def test_nan_scores_rank_as_largest():
  scores = jnp.array([1.0, jnp.nan, 0.5, 2.0])
  np.testing.assert_array_equal(methods.prune_lowest(scores, 2), [0, 1, 0, 1])


@pytest.mark.slow
@settings(max_examples=40)
@given(
  values=st.lists(st.integers(-4, 4), min_size=1, max_size=24),
  alive_bits=st.lists(st.booleans(), min_size=24, max_size=24),
  fraction=st.sampled_from([0.0, 0.1, 0.25, 0.3, 0.5, 0.7, 1.0]),
)
def test_prune_lowest_matches_reference(values, alive_bits, fraction):
  # Small integers force many ties, which the reference breaks by index.
  scores = np.array(values, np.float32)
  previous = np.array(alive_bits[: len(values)])
  got = methods.prune_lowest(jnp.asarray(scores), fraction, jnp.asarray(previous))
  np.testing.assert_array_equal(got, reference_prune_lowest(scores, fraction, previous))


def test_jit_with_traced_mask_matches_eager():
  rng = np.random.default_rng(0)
  scores = jnp.asarray(rng.normal(size=(7, 9)).astype(np.float32))
  previous = jnp.asarray(rng.random((7, 9)) > 0.3)
  jitted = jax.jit(lambda s, p: methods.prune_lowest(s, 0.4, p))
  np.testing.assert_array_equal(
    jitted(scores, previous), reference_prune_lowest(scores, 0.4, previous)
  )
  jitted_count = jax.jit(lambda s, p: methods.prune_lowest(s, 5, p))
  np.testing.assert_array_equal(
    jitted_count(scores, previous), reference_prune_lowest(scores, 5, previous)
  )


@pytest.mark.parametrize(
  'amount, error',
  [
    (-1, ValueError),
    (1.5, ValueError),
    (-0.1, ValueError),
    (True, TypeError),
    ('0.3', TypeError),
  ],
)
def test_bad_amounts(amount, error):
  with pytest.raises(error, match='amount'):
    methods.prune_lowest(jnp.ones(4), amount)


def test_count_larger_than_unpruned_entries_is_an_error():
  with pytest.raises(ValueError, match='amount=3 is larger than the 2 entries'):
    methods.prune_lowest(jnp.ones(4), 3, jnp.array([True, False, True, False]))


def test_l1_unstructured_torch_tutorial_bias():
  # torch tutorial: prune.l1_unstructured(conv1, 'bias', amount=3) -> bias_mask [0, 1, 0, 0, 1, 1].
  bias = jnp.array([0.0960, 0.1381, 0.1054, -0.0058, 0.2609, -0.2368])
  mask = methods.L1Unstructured(3).compute_mask(bias, jnp.ones(6, bool))
  np.testing.assert_array_equal(mask, [0, 1, 0, 0, 1, 1])


def test_random_unstructured_prunes_exact_count_of_alive_entries():
  previous = jnp.arange(40).reshape(5, 8) % 3 != 0  # 26 alive
  for seed in range(5):
    method = methods.RandomUnstructured(0.5, jax.random.key(seed))
    mask = method.compute_mask(jnp.ones((5, 8)), previous)
    assert int(mask.sum()) == 13
    assert not bool(jnp.any(mask & ~previous))
  first = methods.RandomUnstructured(0.5, jax.random.key(0)).compute_mask(jnp.ones(40), None)
  again = methods.RandomUnstructured(0.5, jax.random.key(0)).compute_mask(jnp.ones(40), None)
  other = methods.RandomUnstructured(0.5, jax.random.key(1)).compute_mask(jnp.ones(40), None)
  np.testing.assert_array_equal(first, again)
  assert bool(jnp.any(first != other))


def test_random_unstructured_is_uniform():
  # Every entry is pruned with probability 3/12; over 400 keys each count is ~100 (sd ~8.7).
  keys = jax.random.split(jax.random.key(7), 400)
  compute = jax.vmap(
    lambda k: methods.RandomUnstructured(3, k).compute_mask(jnp.ones(12), jnp.ones(12, bool))
  )
  pruned_counts = np.asarray(jnp.sum(~compute(keys), axis=0))
  assert pruned_counts.sum() == 1200
  assert pruned_counts.min() > 60 and pruned_counts.max() < 140


def reference_ln_structured(w, amount, n, axis, previous):
  w = np.asarray(w, np.float64) * previous
  moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
  norms = np.array(
    [
      np.sum(np.abs(row) ** n) ** (1 / n) if np.isfinite(n) else np.max(np.abs(row))
      for row in moved
    ]
  )
  alive = np.moveaxis(previous, axis, 0).reshape(w.shape[axis], -1).any(axis=1)
  keep = reference_prune_lowest(norms, amount, alive)
  shape = [1] * w.ndim
  shape[axis] = -1
  return previous & keep.reshape(shape)


@pytest.mark.parametrize('n', [1, 2, float('inf')])
@pytest.mark.parametrize('axis', [0, 1, -1])
def test_ln_structured_matches_reference(n, axis):
  rng = np.random.default_rng(3)
  w = rng.normal(size=(6, 5, 4)).astype(np.float32)
  previous = rng.random((6, 5, 4)) > 0.2
  masked = jnp.where(previous, w, 0.0)
  got = methods.LnStructured(0.4, n, axis).compute_mask(masked, jnp.asarray(previous))
  np.testing.assert_array_equal(got, reference_ln_structured(w, 0.4, n, axis % 3, previous))


def test_ln_structured_by_hand():
  # Columns (axis=-1) of a Dense kernel: L1 norms 3, 12, 7, 5 -> amount 2 prunes columns 0 and 3.
  w = jnp.array([[1.0, 5.0, -3.0, 2.0], [-2.0, 7.0, 4.0, 3.0]])
  mask = methods.LnStructured(2, 1, -1).compute_mask(w, jnp.ones((2, 4), bool))
  np.testing.assert_array_equal(mask, [[0, 1, 1, 0], [0, 1, 1, 0]])


def test_ln_structured_counts_only_unpruned_slices():
  w = jnp.array([[1.0, 5.0, -3.0, 2.0], [-2.0, 7.0, 4.0, 3.0]])
  previous = jnp.array([[1, 0, 1, 1], [1, 0, 1, 1]], bool)  # column 1 already gone
  # 0.34 of the 3 alive columns = round(1.02) = 1 column: the smallest alive, column 0.
  mask = methods.LnStructured(0.34, 1, -1).compute_mask(w * previous, previous)
  np.testing.assert_array_equal(mask, [[0, 0, 1, 1], [0, 0, 1, 1]])


def test_ln_structured_rejects_bad_arguments():
  with pytest.raises(ValueError, match='n=0'):
    methods.LnStructured(0.5, 0, 0)
  with pytest.raises(ValueError, match='fewer than 2 dimensions'):
    methods.LnStructured(0.5, 2, 0).compute_mask(jnp.ones(4), jnp.ones(4, bool))
  with pytest.raises(ValueError, match='axis=2 is out of range'):
    methods.LnStructured(0.5, 2, 2).compute_mask(jnp.ones((2, 2)), jnp.ones((2, 2), bool))


def test_nm_structured_respects_previous_mask():
  # Groups of 4 along axis 0 of a (4, 1) kernel; entry 3 (the largest) was pruned before.
  w = jnp.array([[4.0], [3.0], [2.0], [9.0]])
  previous = jnp.array([[True], [True], [True], [False]])
  mask = methods.NMStructured(2, 4).compute_mask(w * previous, previous)
  np.testing.assert_array_equal(mask[:, 0], [1, 1, 0, 0])
  # A group with fewer than n alive entries keeps only those.
  previous = jnp.array([[True], [False], [False], [False]])
  mask = methods.NMStructured(2, 4).compute_mask(w * previous, previous)
  np.testing.assert_array_equal(mask[:, 0], [1, 0, 0, 0])


def test_nm_structured_validates_at_construction():
  with pytest.raises(ValueError, match='1 <= N < M'):
    methods.NMStructured(4, 4)


def test_protocol_is_recognised():
  assert isinstance(methods.L1Unstructured(0.1), methods.PruningMethod)
  assert not isinstance(object(), methods.PruningMethod)
