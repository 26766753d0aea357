"""jaxprune._search.counting: the exact counting passes every threshold search is built on,
against counts made with numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxprune._search import counting as counting


def _part(values, unit_axes=0):
  return counting.Part(counting.WeightReader.of(jnp.asarray(values)), values.shape, unit_axes)


def _unit_scale(units):
  return jnp.ones((units,), jnp.float32), jnp.ones((units,), jnp.float32)


def _numpy_counts(values, thresholds):
  """count(v >= t) for each candidate t."""
  return np.array([np.sum(values >= t) for t in thresholds])


def test_counts_per_unit_and_candidate():
  rng = np.random.default_rng(0)
  a = rng.random((6, 5), dtype=np.float32)
  b = rng.random((3, 4, 7), dtype=np.float32)
  layout = counting.Layout((_part(a), _part(b)))
  thresholds = np.array([[0.0, 0.25, 0.5, 0.99], [0.1, 0.3, 0.7, 1.0 - 2**-24]], np.float32)
  got = counting.counts(layout, [_unit_scale(1), _unit_scale(1)], jnp.asarray(thresholds))
  np.testing.assert_array_equal(
    got, [_numpy_counts(a, thresholds[0]), _numpy_counts(b, thresholds[1])]
  )


def test_stacked_layers_are_units_of_their_own():
  rng = np.random.default_rng(1)
  stacked = rng.random((3, 8, 4), dtype=np.float32)  # 3 layers
  layout = counting.Layout((_part(stacked, unit_axes=1),))
  assert layout.num_units == 3
  thresholds = np.array([[0.2, 0.6], [0.5, 0.9], [0.0, 0.4]], np.float32)
  got = counting.counts(layout, [_unit_scale(3)], jnp.asarray(thresholds))
  np.testing.assert_array_equal(got, [_numpy_counts(stacked[i], thresholds[i]) for i in range(3)])


def test_a_shared_unit_counts_all_parts_together():
  rng = np.random.default_rng(2)
  a, b = rng.random((4, 4), dtype=np.float32), rng.random((2, 9), dtype=np.float32)
  layout = counting.Layout((_part(a), _part(b)), shared=True)
  thresholds = np.array([[0.3, 0.8]], np.float32)
  got = counting.counts(layout, [_unit_scale(1), _unit_scale(1)], jnp.asarray(thresholds))
  np.testing.assert_array_equal(
    got, [_numpy_counts(np.concatenate([a.ravel(), b.ravel()]), thresholds[0])]
  )
  with pytest.raises(ValueError, match='unit_axes=0'):
    counting.Layout((_part(a, unit_axes=1),), shared=True)


def test_scales_multiply_the_values():
  values = np.array([[0.5, 1.5], [3.0, 6.0]], np.float32)  # scaled by 1/8 into [0, 1)
  layout = counting.Layout((_part(values),))
  scale = jnp.asarray([0.5], jnp.float32), jnp.asarray([0.25], jnp.float32)
  got = counting.counts(layout, [scale], jnp.asarray([[0.0625, 0.1875, 0.5]], jnp.float32))
  np.testing.assert_array_equal(got, [[4, 3, 1]])  # >= 0.5, 1.5, 4.0 before scaling


def test_sampled_passes_count_every_16th_row():
  rng = np.random.default_rng(3)
  values = rng.random((40, 3), dtype=np.float32)
  layout = counting.Layout((_part(values),))
  got = counting.counts(layout, [_unit_scale(1)], jnp.asarray([[0.5]], jnp.float32), sample=True)
  np.testing.assert_array_equal(got, [_numpy_counts(values[::16], [0.5])])
  assert layout.sizes(sample=True).tolist() == [3 * 3]


def test_one_axis_values_are_folded_into_rows():
  assert counting.rows_shape((4096 * 3,), 0) == (3, 4096)
  assert counting.rows_shape((2, 12), 1) == (2, 3, 4)
  assert counting.rows_shape((7,), 0) == (7, 1)
  assert counting.rows_shape((5, 6), 0) == (5, 6)
  values = np.random.default_rng(4).random(4096 * 3, dtype=np.float32)
  got = counting.counts(
    counting.Layout((_part(values),)), [_unit_scale(1)], jnp.asarray([[0.25, 0.75]], jnp.float32)
  )
  np.testing.assert_array_equal(got, [_numpy_counts(values, [0.25, 0.75])])


def test_inactive_parts_are_not_read():
  values = np.full((2, 2), 0.5, np.float32)
  layout = counting.Layout((_part(values), _part(np.full((2, 2), 0.25, np.float32))))
  thresholds = jnp.asarray([[0.6], [0.2]], jnp.float32)
  scales = [_unit_scale(1)] * 2
  assert counting.counts(layout, scales, thresholds).tolist() == [[0], [4]]
  # Part 0 inactive: not counted, so its row is its size (4), not its count (0).
  got = counting.counts(layout, scales, thresholds, active=jnp.asarray([False, True]))
  assert got.tolist() == [[4], [4]]


def test_a_unit_beyond_int32_is_refused():
  huge = counting.Part(lambda pass_value: None, (2**16, 2**15 + 1))
  with pytest.raises(ValueError, match='at most 2\\*\\*31 - 1 weights'):
    counting.Layout((huge,)).sizes()


def test_maxima_per_unit_and_nonfinite():
  stacked = np.array([[[0.1, 0.7]], [[np.nan, 0.2]], [[np.inf, 0.2]]], np.float32)
  layout = counting.Layout((_part(stacked, unit_axes=1),))
  maxima = counting.joined_maxima(counting.part_maxima(layout))
  assert maxima[0] == np.float32(0.7) and np.isinf(maxima[1]) and np.isinf(maxima[2])


@pytest.mark.parametrize('shape', [(63, 65), (64, 64), (256, 256)])
def test_maxima_see_one_nan_in_a_large_array(shape):
  # XLA:CPU's max drops a NaN from arrays of 4096 or more elements.
  values = np.ones(shape, np.float32)
  values[3, 7] = np.nan

  def maxima_of(v):
    return counting.joined_maxima(counting.part_maxima(counting.Layout((_part(v),))))

  maxima = jax.jit(maxima_of)(values)
  assert np.isinf(maxima[0])


@pytest.mark.slow
def test_pieces_are_each_parts_rows_bit_for_bit():
  # 280 units: past one window of selection (256), with a stacked part across its edge.
  units = [1] * 250 + [20] + [1] * 10
  parts = tuple(
    counting.Part(lambda pass_value: None, (n, 2, 2) if n > 1 else (2, 2), 1 if n > 1 else 0)
    for n in units
  )
  layout = counting.Layout(parts)
  rng = np.random.default_rng(5)
  floats = rng.normal(size=(280, 3)).astype(np.float32)
  floats[:4, 0] = [np.nan, -0.0, np.inf, -np.inf]
  ints = rng.integers(-(2**31), 2**31 - 1, size=(280,), dtype=np.int32)
  flags = rng.random((280, 1)) < 0.5
  bounds = np.cumsum(units)[:-1]
  for values in (floats, ints, flags):
    got = jax.jit(layout.pieces)(values)
    for piece, want in zip(got, np.split(values, bounds), strict=True):
      assert piece.dtype == want.dtype and piece.shape == want.shape
      np.testing.assert_array_equal(np.asarray(piece).view(np.uint8), want.view(np.uint8))
