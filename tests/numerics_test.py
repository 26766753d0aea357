"""Exact float32 building blocks, against numpy's correctly rounded float32 and float64."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune import _numerics as numerics

F32 = np.float32


def _samples(n, seed):
  rng = np.random.default_rng(seed)
  return (rng.random(n) * 2.0 ** rng.integers(-20, 20, n)).astype(F32)


def test_div_rn_is_the_correctly_rounded_quotient():
  x, y = _samples(20000, 0), _samples(20000, 1)
  y[y == 0] = 1
  # numpy's float32 division is IEEE (correctly rounded); XLA's on CPU need not be.
  np.testing.assert_array_equal(np.asarray(jax.jit(numerics.div_rn)(x, y)), x / y)
  assert float(numerics.div_rn(F32(0.0), F32(3.0))) == 0.0


def test_two_product_is_error_free():
  x, y = _samples(5000, 2), _samples(5000, 3)
  p, e = jax.jit(numerics.two_product)(x, y)
  exact = x.astype(np.float64) * y.astype(np.float64)  # 24 + 24 bits fit in float64's 53
  np.testing.assert_array_equal(np.asarray(p, np.float64) + np.asarray(e, np.float64), exact)


def test_step_ulps_is_nextafter():
  x = _samples(100, 4)
  np.testing.assert_array_equal(numerics.step_ulps(x, 1), np.nextafter(x, F32(np.inf)))
  np.testing.assert_array_equal(numerics.step_ulps(x, -1), np.nextafter(x, F32(0)))
  assert float(numerics.step_ulps(F32(0.0), -3)) == 0.0


def test_exponent_scaling_and_ldexp():
  for value, exponent in ((1.0, 1), (0.75, 0), (2.0**100, 101), (3e-40, -125)):
    assert int(numerics.count_exponent(jnp.float32(value))) == exponent
  assert float(numerics.power_of_two(jnp.int32(-126))) == 2.0**-126
  # -220 needs two factors: 2**-220 alone is not a float32.
  big = jnp.float32(0.75 * 2.0**100)
  assert float(numerics.ldexp(big, jnp.int32(-220))) == 0.75 * 2.0**-120
  assert float(numerics.ldexp(jnp.float32(1.5), jnp.int32(120))) == 1.5 * 2.0**120


def test_limits():
  assert numerics.INT32_MAX == np.iinfo(np.int32).max
  assert numerics.SMALLEST_NORMAL == float(np.finfo(np.float32).tiny)
  # 2**24 is the last integer from which every smaller one is a float32.
  assert F32(numerics.MAX_NBINS - 1) == numerics.MAX_NBINS - 1
  assert F32(numerics.MAX_NBINS + 1) == F32(numerics.MAX_NBINS)
