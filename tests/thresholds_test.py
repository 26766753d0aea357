"""Threshold rules at their boundaries: the keep-at-least-one rule and the last histogram bin."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import references

import jaxprune
from jaxprune import _numerics as numerics
from jaxprune._search import thresholds as thresholds

LINSPACE = np.linspace(1, 100, 100, dtype=np.float32).reshape(10, 10)


@pytest.mark.parametrize(
  'total, sparsity, kept',
  [
    (3, 0.9, 1),  # round(0.3) = 0: at least one is kept
    (100, 0.999, 1),  # round(0.1) = 0
    (100, 0.5, 50),
    (13, 0.5, 6),
    (10, 0.0, 10),
  ],
)
def test_exact_keep_count_keeps_at_least_one(total, sparsity, kept):
  assert int(thresholds.exact_keep_count(total, jnp.float32(sparsity))) == kept


def test_exact_rule_keeps_the_largest_when_the_count_rounds_to_zero():
  """N(1 - s) = 0.3 rounds to 0 kept; tfmot's rule keeps max(round(N(1 - s)), 1) = 1.

  Through `update_mask` keeping 0 and keeping 1 cannot be told apart: the search
  for the largest value with count(a >= value) >= k ends at max|w| in both cases
  (for k = 0 every value qualifies and the bracket's top is the maximum), so the
  mask is `a >= max` either way. `exact_keep_count` itself is tested above.
  """
  w = jnp.asarray([[0.5, -3.0, 2.0]], jnp.float32)
  threshold, mask = jax.jit(lambda w: jaxprune.update_mask(w, 0.0, 0.9, threshold_method='exact'))(
    w
  )
  assert float(threshold) == 3.0
  np.testing.assert_array_equal(mask, [[False, True, False]])


def test_histogram_answer_in_the_last_bin():
  """s = 0.99 on 1..100 with 4 bins: the CDF is 0.24, 0.49, 0.74, 1.0, so 3 bins lie below.

  The threshold is 3/4 of the maximum, 75, and 25 weights are kept. The last
  bin's CDF is 1 by definition (values at the maximum land in it); the search
  never decides on that bin (it is the bracket's upper end, known to reach any
  s < 1), so whether its CDF is taken as 1 or counted cannot change a result:
  writing `k >= nbins` for `k >= nbins - 1` there is an equivalent program.
  """
  threshold, mask = jax.jit(lambda w: jaxprune.update_mask(w, 0.0, 0.99, nbins=4))(LINSPACE)
  assert float(threshold) == 75.0
  assert int(mask.sum()) == 25
  cdf = jax.jit(lambda w: thresholds.histogram_cdf(w, 100.0, 4))(LINSPACE)
  np.testing.assert_array_equal(np.asarray(cdf), np.float32([0.24, 0.49, 0.74, 1.0]))


def test_exact_rule_on_a_large_tensor_uses_the_full_count():
  # Large enough for the search to start from an estimate made on every 16th row;
  # those rows are 10x larger here, so the estimate is far off and only the full
  # count can find the answer.
  rng = np.random.default_rng(3)
  w = rng.standard_normal((1024, 1024)).astype(np.float32)
  w[::16] *= 10
  threshold, mask = jax.jit(lambda w: jaxprune.update_mask(w, 0.0, 0.5, threshold_method='exact'))(
    w
  )
  assert threshold == references.exact_rule(np.abs(w), 0.5)
  assert int(mask.sum()) == 524_288


@pytest.mark.slow
@pytest.mark.parametrize('size, kept', [(13, 6), (11, 6), (3, 2)])
def test_exact_keep_count_rounds_half_to_even(size, kept):
  # tfmot's tf.round: 13 * 0.5 = 6.5 -> 6, 11 * 0.5 = 5.5 -> 6, 3 * 0.5 = 1.5 -> 2.
  w = jnp.asarray(np.arange(1, size + 1, dtype=np.float32).reshape(1, size))
  _, mask = jaxprune.update_mask(w, 0.0, 0.5, threshold_method='exact')
  assert int(mask.sum()) == kept


@pytest.mark.parametrize(
  'kept, expected', [(3, np.float32(2e-35)), (4, np.float32(1e-35)), (6, np.float32(0.0))]
)
def test_exact_answer_far_below_the_maximum(kept, expected):
  # The k-th largest magnitude is below 2**-100 of the largest: counted by the
  # search's comparison path, it must still be the element itself.
  w = np.array([[1.0, -3e-35, 2e-35, -1e-35, 0.0, 0.0, 0.0, 0.0]], np.float32)
  sparsity = 1.0 - kept / 8
  threshold, mask = jaxprune.update_mask(jnp.asarray(w), 0.0, sparsity, threshold_method='exact')
  assert threshold == expected
  np.testing.assert_array_equal(mask, np.abs(w) >= expected)


@pytest.mark.parametrize('nbins', [7, 256])
def test_bin_edge_is_the_smallest_value_in_a_bin_at_or_above_k(nbins):
  rng = np.random.default_rng(nbins)
  m = (rng.random(400) * 2.0 ** rng.integers(-10, 10, 400)).astype(np.float32) + np.float32(1e-3)
  k = rng.integers(1, nbins + 1, 400).astype(np.int32)
  edge = np.asarray(jax.jit(thresholds.bin_edge, static_argnums=2)(k, m, nbins))

  def bin_at_least_k(a):  # the exact rule in numpy's correctly rounded float32
    return np.float32(nbins) * (a.astype(np.float32) / m) >= k

  assert bin_at_least_k(edge).all()
  assert not bin_at_least_k(np.nextafter(edge, np.float32(0))).any()


def test_fractions_are_the_quotients_the_search_rounds():
  # The histogram rule's k / nbins for static k, from the host: the float32 that
  # numerics.div_rn(k, nbins) gives on the device, for every k <= nbins <= 4096.
  nbins = np.concatenate([np.full(n + 1, n) for n in range(1, 4097)]).astype(np.float32)
  k = np.concatenate([np.arange(n + 1) for n in range(1, 4097)]).astype(np.float32)
  on_device = np.asarray(jax.jit(numerics.div_rn)(k, nbins))
  on_host = np.concatenate([thresholds.fractions(n) for n in range(1, 4097)])
  np.testing.assert_array_equal(on_host.view(np.uint32), on_device.view(np.uint32))
