"""Magnitude thresholds: TF's histogram CDF rule and the exact k-th value (SPEC section 4).

Neither rule sorts nor builds a histogram. Both are searches over a monotone
count: `count(a >= t)` for a candidate t, computed in one memory-speed pass
(`numerics.count_at_least`). The histogram rule searches the `nbins` bin edges;
the exact rule searches float32 bit patterns, which are ordered like the
non-negative values they encode. Both start from an estimate made on every 16th
row, which decides only where the search starts, never its result: about 2
full passes for the histogram rule and 15 for the exact one, instead of
log2(nbins) and 31. Every function takes a list of arrays of magnitudes so that
one threshold can span several variables (global pruning) without
concatenating them.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
from jax import Array, lax

from jaxprune import numerics

_EDGE_SEARCH_ULPS = 4
_SAMPLE_STRIDE = 16  # rows of the estimate's sample
_MIN_SAMPLE = 4096  # smaller samples bisect all elements directly
_GRID = 4096  # cells of [0, max] that bracket the exact search


def _size(parts: Sequence[Array]) -> int:
  return sum(int(p.size) for p in parts)


def _count(parts: Sequence[Array], threshold: Array) -> Array:
  """count(a >= threshold) over parts pre-scaled into [0, 1) (see numerics.count_at_least)."""
  return sum(numerics.count_at_least(p, threshold) for p in parts)


def _scaled(parts: Sequence[Array], exponent: Array) -> list[Array]:
  """parts * 2**-exponent: exact, and the one array every counting pass reads.

  Two normal powers of two (a single 2**-128 would be subnormal, i.e. zero).
  """
  half = exponent // 2
  first = jnp.ldexp(jnp.float32(1.0), -half)
  second = jnp.ldexp(jnp.float32(1.0), half - exponent)
  return [p * first * second for p in parts]


def magnitude_max(parts: Sequence[Array]) -> Array:
  """max(|a|) over all parts (float32 scalar)."""
  return jnp.max(jnp.stack([jnp.max(p) for p in parts]))


def bin_edge(k: Array, value_max: Array, nbins: int) -> Array:
  """The smallest float32 a >= 0 whose bin, floor(nbins * (a / m)), is >= k.

  So `bin(a) >= k` exactly when `a >= bin_edge(k)`. The edge is within a few
  ulps of k * m / nbins; the neighbours are checked with the exact rule.
  """
  k = jnp.asarray(k, jnp.float32)
  guess = numerics.div_rn(k, jnp.float32(nbins)) * value_max
  above, below = [guess], [guess]
  for _ in range(_EDGE_SEARCH_ULPS):
    above.append(jnp.nextafter(above[-1], jnp.float32(jnp.inf)))
    below.append(jnp.nextafter(below[-1], jnp.float32(-jnp.inf)))
  candidates = jnp.maximum(jnp.stack(below[:0:-1] + above), 0.0)  # ascending
  bins = jnp.float32(nbins) * numerics.div_rn(candidates, value_max)
  first = jnp.argmax(bins >= k)
  return candidates[first]


def _cdf_at_least(count_le: Array, total: int, sparsity: Array) -> Array:
  """Whether fl(count_le / total) >= sparsity, with a correctly rounded quotient."""
  cdf = numerics.div_rn(jnp.asarray(count_le, jnp.float32), jnp.float32(total))
  return cdf >= sparsity


def _bisect(reaches, lo: Array, hi: Array, steps: int) -> Array:
  """The first k in (lo, hi] with reaches(k), given not reaches(lo) and reaches(hi).

  `steps` must be >= ceil(log2(hi - lo)).
  """
  def step(_, bounds):
    lo, hi = bounds
    mid = (lo + hi) // 2
    ok = reaches(mid)
    done = hi - lo <= 1  # converged early: keep the bounds
    return jnp.where(ok | done, lo, mid), jnp.where(ok & ~done, mid, hi)

  _, hi = lax.fori_loop(0, steps, step, (lo, hi))
  return hi


def _gallop(reaches, guess: Array, lo: Array, hi: Array) -> Array:
  """Like `_bisect`, starting from a guess of the answer.

  Probes the guess, then steps away from it by 1, 1, 2, 4, ... until a probe
  flips, then bisects: two probes when the guess is right, three when it is
  one off, about 2 * log2(error) otherwise.
  """
  def unfinished(state):
    lo, hi = state[:2]
    return hi - lo > 1

  def step(state):
    lo, hi, probe, delta, previous, bracketed = state
    probe = jnp.clip(probe, lo + 1, hi - 1)
    ok = reaches(probe)
    lo, hi = jnp.where(ok, lo, probe), jnp.where(ok, probe, hi)
    bracketed |= (previous >= 0) & (ok != (previous == 1))
    gallop = jnp.where(ok, probe - delta, probe + delta)
    probe = jnp.where(bracketed, (lo + hi) // 2, gallop)
    delta = jnp.where(previous >= 0, delta * 2, delta)
    return lo, hi, probe, delta, ok.astype(jnp.int32), bracketed

  state = (lo, hi, guess, jnp.int32(1), jnp.int32(-1), jnp.bool_(False))
  return lax.while_loop(unfinished, step, state)[1]


def histogram_threshold(parts: Sequence[Array], value_max: Array, sparsity: Array,
                        nbins: int) -> Array:
  """TF's histogram threshold on magnitudes `parts` with maximum `value_max` > 0.

  Returns (number of bins whose CDF is below `sparsity`) / nbins * max: the
  lower edge of the first bin whose CDF reaches `sparsity` (SPEC section 4).

  The first bin whose CDF reaches s is searched with exact counts over all
  elements, starting from an estimate on every 16th row. The estimate only
  decides where the search starts, never the result; on large tensors it is
  usually exact, so the search takes two counting passes instead of log2(nbins).
  """
  exponent = numerics.count_exponent(value_max)
  scaled = _scaled(parts, exponent)
  # Quotients a / max are the same after exact scaling, and in [0.5, 1) the
  # error-free products of the edge search neither overflow nor underflow.
  scaled_max = _scaled([value_max], exponent)[0]
  lo, hi = jnp.int32(-1), jnp.int32(nbins - 1)
  steps = (nbins - 1).bit_length()

  def reaches_on(values):
    total = _size(values)

    def reaches(k):
      # cdf[k] = count(bin <= k) / N, and bin <= k  <=>  a < edge(k + 1); edges are
      # >= max / nbins, far above numerics.TINY after scaling.
      edge = bin_edge(k + 1, scaled_max, nbins)
      count_le = jnp.where(k >= nbins - 1, total, total - _count(values, edge))
      return (k >= 0) & _cdf_at_least(count_le, total, sparsity)
    return reaches

  samples = _samples(scaled)
  if _size(samples) < _MIN_SAMPLE:
    first = _bisect(reaches_on(scaled), lo, hi, steps)
  else:
    guess = _bisect(reaches_on(samples), lo, hi, steps)
    first = _gallop(reaches_on(scaled), guess, lo, hi)
  return numerics.div_rn(first.astype(jnp.float32), jnp.float32(nbins)) * value_max


def histogram_cdf(values: Array, value_max: float | Array, nbins: int) -> Array:
  """The CDF of |values| over `nbins` equal bins of [0, value_max] (reporting, tests).

  Values above the range land in the last bin, as in TF's
  `histogram_fixed_width`. Costs one counting pass per bin.
  """
  parts = [jnp.abs(jnp.asarray(values, jnp.float32))]
  value_max = jnp.asarray(value_max, jnp.float32)
  total = _size(parts)
  exponent = numerics.count_exponent(jnp.maximum(value_max, magnitude_max(parts)))
  scaled = _scaled(parts, exponent)
  scaled_max = _scaled([value_max], exponent)[0]
  counts = [total - _count(scaled, bin_edge(k + 1, scaled_max, nbins))
            for k in range(nbins - 1)]
  counts = jnp.stack(counts + [jnp.int32(total)]).astype(jnp.float32)
  return numerics.div_rn(counts, jnp.float32(total))


def keep_count(total: int, sparsity: Array) -> Array:
  """tfmot's rule: k = max(round(N * (1 - s)), 1), in float32, half to even."""
  kept = jnp.round(jnp.float32(total) * (jnp.float32(1.0) - sparsity))
  return jnp.maximum(kept, 1.0).astype(jnp.int32)


def _largest_key_with(enough, lo: Array, hi: Array) -> Array:
  """The largest int32 key in [lo, hi) with enough(key), given enough(lo) and not enough(hi)."""
  def step(bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) // 2
    ok = enough(mid)
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

  return lax.while_loop(lambda bounds: bounds[1] - bounds[0] > 1, step, (lo, hi))[0]


def _samples(scaled: Sequence[Array]) -> list[Array]:
  """Every 16th row of each part: where the searches' estimates are made."""
  return [rows[::_SAMPLE_STRIDE] for rows in map(numerics.rows, scaled)]


def exact_threshold(parts: Sequence[Array], value_max: Array, sparsity: Array) -> Array:
  """The k-th largest magnitude, k = keep_count(N, sparsity); `mask = a >= it`.

  Searches the largest float32 bit pattern b with count(a >= float(b)) >= k,
  which is the value a sort would put at position k - 1 from the top. The bit
  search starts inside the cell of a uniform grid over [0, max] that holds the
  answer, found from an estimate on every 16th row (as in `histogram_threshold`),
  which takes about 12 bits off the search. The fast count is exact above
  `numerics.TINY` (after scaling); when the answer lies below it (almost all
  weights are < 1e-30 of the largest) the search compares instead.
  """
  total = _size(parts)
  kept = keep_count(total, sparsity)
  exponent = numerics.count_exponent(value_max)
  scaled = _scaled(parts, exponent)
  scaled_max = _scaled([value_max], exponent)[0]
  tiny = jnp.float32(numerics.TINY)
  as_key = lambda x: lax.bitcast_convert_type(x, jnp.int32)
  as_value = lambda key: lax.bitcast_convert_type(key, jnp.float32)

  def grid(j):
    # Non-decreasing in j; 0 -> tiny (count >= kept, checked below), GRID + 1 -> inf.
    value = j.astype(jnp.float32) * (scaled_max / _GRID)
    return jnp.where(j > _GRID, jnp.float32(jnp.inf), jnp.maximum(value, tiny))

  def fewer_than(values, needed):
    return lambda j: _count(values, grid(j)) < needed

  def fast():
    samples = _samples(scaled)
    lo, hi = jnp.int32(0), jnp.int32(_GRID + 1)
    if _size(samples) < _MIN_SAMPLE:
      cell = _bisect(fewer_than(scaled, kept), lo, hi, (_GRID + 1).bit_length())
    else:
      sample_kept = jnp.ceil(kept * (_size(samples) / total)).astype(jnp.int32)
      guess = _bisect(fewer_than(samples, sample_kept), lo, hi, (_GRID + 1).bit_length())
      cell = _gallop(fewer_than(scaled, kept), guess, lo, hi)
    # count(a >= grid(cell - 1)) >= kept > count(a >= grid(cell)).
    upper = jnp.where(cell > _GRID, as_key(scaled_max) + 1, as_key(grid(cell)))
    enough = lambda key: _count(scaled, as_value(key)) >= kept
    key = _largest_key_with(enough, as_key(grid(cell - 1)), upper)
    # Scaling back by a power of two is exact: the result is an element of `parts`.
    return jnp.ldexp(as_value(key), exponent)

  def slow():
    enough = lambda key: sum(numerics.count_at_least_slow(p, as_value(key)) for p in parts) >= kept
    unscaled_tiny = jnp.ldexp(tiny, exponent)
    key = _largest_key_with(enough, jnp.int32(0), as_key(unscaled_tiny))
    # CPU XLA compares subnormals as zero, so the search cannot tell them from 0.
    smallest_normal = as_key(jnp.float32(numerics.SMALLEST_NORMAL))
    return as_value(jnp.where(key < smallest_normal, 0, key))

  return lax.cond(_count(scaled, tiny) >= kept, fast, slow)
