"""Exact float32 building blocks for thresholds, and the limits of the engine's arithmetic.

docs/explanation/semantics.md#float32-numerics defines thresholds on correctly
rounded float32 quotients, but XLA's float32 division is not guaranteed to be
correctly rounded, and values on a bin edge decide the result. These helpers
give exact answers at scalar or small-vector cost; `thresholds` builds its
exact searches on them.

The limits below are where the hyperparameters' checks come from: steps and
sizes are int32 arrays inside jit, and counts, bin indices and the schedule
are float32.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array, lax

_SPLITTER = 4097.0  # 2**12 + 1: Veltkamp's split of a 24-bit significand.
SMALLEST_NORMAL = 2.0**-126
# Steps, sizes and block dims live in int32 arrays inside jit.
INT32_MAX = 2**31 - 1
# Bin indices, counts and k / nbins stay exact in float32 up to 2**24.
MAX_NBINS = 2**24


def _split(x: Array) -> tuple[Array, Array]:
  c = x * jnp.float32(_SPLITTER)
  hi = c - (c - x)
  return hi, x - hi


def two_product(x: Array, y: Array) -> tuple[Array, Array]:
  """Dekker's error-free product: x * y == p + e exactly (barring over/underflow)."""
  p = x * y
  xh, xl = _split(x)
  yh, yl = _split(y)
  e = ((xh * yh - p) + xh * yl + xl * yh) + xl * yl
  return p, e


def as_key(x: Array) -> Array:
  """The int32 bit pattern of float32 x: ordered like x for x >= 0."""
  return lax.bitcast_convert_type(jnp.asarray(x, jnp.float32), jnp.int32)


def as_value(key: Array) -> Array:
  """The float32 of an int32 bit pattern (the inverse of `as_key`)."""
  return lax.bitcast_convert_type(key, jnp.float32)


def step_ulps(x: Array, ulps: int) -> Array:
  """The float32 `ulps` steps above x (below for negative ulps), for finite x >= 0.

  Adjacent bit patterns of non-negative floats are adjacent values, so this is
  `nextafter` applied |ulps| times, in one integer add; it stops at 0.
  """
  return as_value(jnp.maximum(as_key(x) + ulps, 0))


def div_rn(x: Array, y: Array) -> Array:
  """The float32 nearest to the true quotient x / y, for finite x >= 0 and y > 0.

  XLA's quotient need not be correctly rounded (within one ulp on CPUs; two on
  an NVIDIA H200). One Newton step with the exact residual brings it within
  about half an ulp; of the result and its two neighbours we keep the one with
  the smallest exact residual |x - q * y|. Ties cannot occur: a float32
  quotient is never exactly halfway between two float32 values.
  """
  x = jnp.asarray(x, jnp.float32)
  y = jnp.asarray(y, jnp.float32)
  q = x / y
  q = q + _residual(x, y, q) / y
  best, best_residual = q, jnp.abs(_residual(x, y, q))
  # q first: when residuals tie (only if flushed to zero, e.g. x == 0) it wins.
  for candidate in (step_ulps(q, -1), step_ulps(q, 1)):
    residual = jnp.abs(_residual(x, y, candidate))
    best = jnp.where(residual < best_residual, candidate, best)
    best_residual = jnp.minimum(residual, best_residual)
  return best


def _residual(x: Array, y: Array, q: Array) -> Array:
  """x - q * y, from the exact product (rounded once, at the end)."""
  p, e = two_product(q, y)
  return (x - p) - e


def count_exponent(value_max: Array) -> Array:
  """The int32 e with 2**e > value_max (>= the smallest normal): scale by 2**-e into [0, 1).

  frexp's exponent, read off the bit pattern of a normal float.
  """
  key = as_key(jnp.maximum(value_max, jnp.float32(SMALLEST_NORMAL)))
  return (key >> 23) - 126


def power_of_two(exponent: Array) -> Array:
  """2.0**exponent as float32, for integer exponents in [-126, 127]."""
  return as_value((exponent + 127) << 23)


def ldexp(x: Array, exponent: Array) -> Array:
  """x * 2**exponent, exactly when the result is a normal float or zero.

  In two factors, each a normal power of two, for exponents up to +-252.
  """
  half = exponent // 2
  return x * power_of_two(half) * power_of_two(exponent - half)


# Counting passes compare magnitudes scaled into [0, 1) with float differences;
# from TINY up those differences are normal floats, which CPU XLA never flushes.
TINY = 2.0**-100
