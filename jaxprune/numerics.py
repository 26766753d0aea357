"""Exact float32 building blocks for thresholds.

SPEC section 4 defines thresholds on correctly rounded float32 quotients, but
XLA's float32 division is not guaranteed to be correctly rounded, and values on
a bin edge decide the result. These helpers give exact answers at scalar or
small-vector cost, and a counting pass that runs at memory speed on CPU.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array

_SPLITTER = 4097.0  # 2**12 + 1: Veltkamp's split of a 24-bit significand.
SMALLEST_NORMAL = 2.0 ** -126


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


def div_rn(x: Array, y: Array) -> Array:
  """The float32 nearest to the true quotient x / y, for finite x >= 0 and y > 0.

  XLA's quotient is at most one ulp away; of it and its two neighbours we keep
  the one with the smallest exact residual |x - q * y|. Ties cannot occur: a
  float32 quotient is never exactly halfway between two float32 values.
  """
  x = jnp.asarray(x, jnp.float32)
  y = jnp.asarray(y, jnp.float32)
  q = x / y
  # q first: when residuals tie (only if flushed to zero, e.g. x == 0) it wins.
  candidates = jnp.stack([q, jnp.nextafter(q, -jnp.inf), jnp.nextafter(q, jnp.inf)])
  p, e = two_product(candidates, y)
  residual = jnp.abs((x - p) - e)
  best = jnp.argmin(residual, axis=0)
  return jnp.take_along_axis(candidates, best[None], axis=0)[0]


def count_exponent(value_max: Array) -> Array:
  """The int32 e with 2**e > value_max (>= the smallest normal): scale by 2**-e into [0, 1)."""
  _, exponent = jnp.frexp(jnp.maximum(value_max, jnp.float32(SMALLEST_NORMAL)))
  return exponent


def rows(values: Array) -> Array:
  """A view whose last axis is short enough to be summed exactly in float32.

  Arrays of rank >= 2 keep their shape, so a tensor sharded along any axis
  is counted where it lives (a reshape could gather it).
  """
  if values.ndim >= 2 and values.shape[-1] <= 2 ** 24:
    return values
  size = values.size
  width = next((w for w in (4096, 1024, 256, 64, 16, 4, 2) if size % w == 0), 1)
  return values.reshape(-1, width)


TINY = 2.0 ** -100


def count_at_least(scaled: Array, threshold: Array) -> Array:
  """Exact int32 count of `scaled >= threshold`, for values in [0, 1).

  XLA on CPU vectorises a float sum of `floor` but not a sum of compares or
  selects (about 8x slower). For |d| < 1, floor(d) is -1 when d < 0 and 0
  otherwise, so floor(v - t) + 1 is the indicator of v >= t: the sign of a
  float difference is exact. Callers scale magnitudes by a power of two
  (`count_scale`, exact) once, so that every pass reads one array and no
  broadcast. Each row sums at most 2**24 ones, which float32 holds exactly.

  CPU XLA flushes subnormals to zero, so the count is exact for threshold == 0
  or threshold >= TINY; callers search below that with `count_at_least_slow`.
  """
  view = rows(scaled)
  below = jnp.sum(jnp.floor(view - threshold), axis=-1)
  return view.size + jnp.sum(below.astype(jnp.int32))


def count_at_least_slow(values: Array, threshold: Array) -> Array:
  """`count_at_least` by comparison: exact for any threshold, several times slower."""
  return jnp.sum(values >= threshold, dtype=jnp.int32)
