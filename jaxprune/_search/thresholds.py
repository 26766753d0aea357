"""Magnitude thresholds of many variables at once.

See docs/explanation/semantics.md#histogram-thresholds.

TF's histogram CDF rule and the exact k-th value, for every unit (a pruned
variable, a stacked layer, or one global set; see `counting.Layout`) in one
search. Neither rule sorts nor builds a histogram: both search a monotone
count, `count(a >= t)`, at J candidates per unit and pass (`counting.counts`),
and the searches of all units advance together in one loop, whatever the
number of variables. They start from an estimate made on every 16th row,
which decides only where they start, never their result: about one full pass
for the histogram rule and a handful for the exact one.

That search ('adaptive') is the CPU's: few candidates per pass, a conditional
per part to skip the settled ones, and a loop that runs until every search
is done. On GPUs and TPUs each conditional and each loop iteration waits for
the device, while arithmetic is nearly free next to reading memory, so there
the searches are 'fixed': a fixed, small number of passes with
FIXED_PROBES candidates each and no per-part control flow (the histogram rule
needs two passes at 256 bins, the exact rule seven, plus at most one loop
that only runs on unusual data). Both searches compute the same thresholds; the
hparam `mask_search` picks one ('auto': by `jax.default_backend()`). (The searches are
called plans in the docs and benchmarks; here 'plan' is left to `structured.Plan`.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array, lax

from jaxprune import _numerics as numerics
from jaxprune._search import counting as counting
from jaxprune._search.brackets import (
  FIXED_PROBES,
  first_reaching,
  fixed_first_reaching,
  passes_for,
)

_EDGE_SEARCH_ULPS = 4
_GRID = 4096  # cells of [0, max] that bracket the exact search
_EDGE_TABLE_MAX = 4096  # bins: larger counts compute each edge where it is used
# Exact rule, fixed search: the grid has 16**3 - 1 cells (three exhaustive passes), and
# the search inside a cell gets this many passes before its loop (2**16 keys: a cell
# holding an answer above 1/16 of the maximum).
_FIXED_GRID = (FIXED_PROBES + 1) ** 3 - 1
_FIXED_KEY_PASSES = 4


def resolve_search(mask_search: str) -> str:
  """The search of the hparam `mask_search`: 'auto' is 'adaptive' on CPUs, 'fixed' elsewhere."""
  if mask_search != 'auto':
    return mask_search
  return 'adaptive' if jax.default_backend() == 'cpu' else 'fixed'


def _scales(value_max: Array) -> tuple[Array, tuple[Array, Array]]:
  """(exponent e, two (units,) powers of two) with values * 2**-e in [0, 1), exactly.

  Two normal powers of two: a single 2**-128 would be subnormal, i.e. zero.
  """
  exponent = numerics.count_exponent(value_max)
  half = exponent // 2
  return exponent, (numerics.power_of_two(-half), numerics.power_of_two(half - exponent))


@dataclasses.dataclass(frozen=True)
class _Scaling:
  """The units' maxima and the exact scaling that maps each unit into [0, 1)."""

  value_max: Array  # (units,)
  exponent: Array  # (units,)
  scaled_max: Array  # (units,), in [0.5, 1)
  part_scales: list[tuple[Array, Array]]  # per part, two (units of the part,) factors

  @classmethod
  def of(cls, layout: counting.Layout, value_max: Array) -> _Scaling:
    """`value_max`: (units,) maxima, finite and > 0."""
    exponent, factors = _scales(value_max)
    part_scales = list(zip(*(layout.pieces(f) for f in factors), strict=True))
    return cls(value_max, exponent, value_max * factors[0] * factors[1], part_scales)


def bin_edge(k: Array, value_max: Array, nbins: int, fraction: Array | None = None) -> Array:
  """The smallest float32 a >= 0 whose bin, floor(nbins * (a / m)), is >= k (elementwise).

  So `bin(a) >= k` exactly when `a >= bin_edge(k)`. The edge is within a few
  ulps of k * m / nbins; the neighbours are checked with the exact rule.
  `fraction`, optionally, is k / nbins rounded to float32 (`fractions`), for a static k.
  """
  k, value_max = jnp.broadcast_arrays(
    jnp.asarray(k, jnp.float32), jnp.asarray(value_max, jnp.float32)
  )
  if fraction is None:
    fraction = numerics.div_rn(k, jnp.float32(nbins))
  guess = fraction * value_max
  # The candidates along a last axis, lowest first, checked in one pass: the edge is the
  # lowest one in a bin >= k (the lowest candidate when none is).
  offsets = jnp.arange(-_EDGE_SEARCH_ULPS, _EDGE_SEARCH_ULPS + 1, dtype=jnp.int32)
  candidates = numerics.step_ulps(guess[..., None], offsets)
  in_bin = jnp.float32(nbins) * numerics.div_rn(candidates, value_max[..., None]) >= k[..., None]
  lowest = jnp.min(jnp.where(in_bin, candidates, jnp.inf), axis=-1)
  return jnp.where(jnp.any(in_bin, axis=-1), lowest, candidates[..., 0])


def fractions(nbins: int) -> np.ndarray:
  """k / nbins for k = 0 .. nbins, each rounded once to float32 (`numerics.div_rn`'s value;
  numpy's float32 division rounds correctly), computed on the host (static)."""
  return np.arange(nbins + 1, dtype=np.float32) / np.float32(nbins)


def histogram_thresholds(
  layout: counting.Layout,
  maxima: Array,
  sparsity: Array,
  nbins: int,
  search: str,
) -> Array:
  """TF's histogram threshold of every unit, given its maximum > 0.

  Returns (number of bins whose CDF is below the unit's sparsity) / nbins * max:
  the lower edge of the first bin whose CDF reaches the sparsity
  (docs/explanation/semantics.md#histogram-thresholds).

  Args:
    layout: the parts and their units.
    maxima: (units,) float32 maxima, finite and > 0.
    sparsity: (units,) float32 targets in [0, 1).
    nbins: histogram bins.
    search: 'adaptive' or 'fixed' (see the module's docstring); the same result.

  Returns:
    (units,) float32 thresholds.
  """
  scaling = _Scaling.of(layout, maxima)

  # cdf[k] = count(bin <= k) / N, and bin <= k  <=>  a < edge(k + 1); edges are
  # >= max / nbins, far above numerics.TINY after scaling. Quotients a / max are
  # the same after exact scaling, and in [0.5, 1) the error-free products of
  # the edge search neither overflow nor underflow. For the usual bin counts a
  # (units, nbins + 1) table is made once: traced into every search body,
  # `bin_edge` dominated compile time.
  if nbins <= _EDGE_TABLE_MAX:
    table = bin_edge(
      jnp.arange(nbins + 1, dtype=jnp.int32)[None, :],
      scaling.scaled_max[:, None],
      nbins,
      fractions(nbins)[None, :],
    )

    def edges(k):
      return jnp.take_along_axis(table, jnp.clip(k + 1, 0, nbins), axis=1)
  else:

    def edges(k):
      return bin_edge(k + 1, scaling.scaled_max[:, None], nbins)

  def reaches_on(sample):
    total = jnp.asarray(layout.sizes(sample), jnp.int32)[:, None]

    def reaches(thresholds, k, active):
      count_le = total - counting.counts(
        layout, scaling.part_scales, thresholds, sample, active=active
      )
      count_le = jnp.where(k >= nbins - 1, total, count_le)
      cdf = numerics.div_rn(count_le.astype(jnp.float32), total.astype(jnp.float32))
      return (k >= 0) & (cdf >= sparsity[:, None])

    return reaches

  def threshold(first):
    if nbins <= _EDGE_TABLE_MAX:  # first is in [0, nbins)
      return jnp.asarray(fractions(nbins))[first] * scaling.value_max
    return numerics.div_rn(first.astype(jnp.float32), jnp.float32(nbins)) * scaling.value_max

  lo = jnp.full((layout.num_units,), -1, jnp.int32)
  hi = jnp.full((layout.num_units,), nbins - 1, jnp.int32)
  if search == 'fixed':  # (lo, hi] holds nbins candidates: no loop is needed
    first = fixed_first_reaching(edges, reaches_on(False), lo, hi, passes_for(nbins), loop=False)
    return threshold(first)
  guess = first_reaching(edges, reaches_on(True), lo, hi)
  return threshold(first_reaching(edges, reaches_on(False), lo, hi, guess))


def exact_keep_count(total: Array | int | np.ndarray, sparsity: Array) -> Array:
  """tfmot's k = max(round(N * (1 - s)), 1) for a float32 sparsity s, exactly, inside jit.

  The rounding: N (1 - s) is rounded half to even once, in exact arithmetic on the float32
  value of s, for every size. `jaxprune.sparse.kept_count` is another rule (a density on
  the host, Python's `round` of the float64 product): the two can differ by one where
  N (1 - s) is about half-way, so they do not share a name.

  N (static, < 2**31) times the float32 sparsity s is rounded once, as if in
  exact arithmetic: tfmot's float32 product drifts by a weight or more beyond
  2**24 weights (float32 cannot hold N, nor k). With s = M * 2**-q (M a 24-bit
  integer), N * s = P / 2**q for the integer P = N * M < 2**55, which is
  built from 12-bit pieces in uint32; k = N - floor(P / 2**q), minus one when
  the remainder is more than half of 2**q (or exactly half and that is odd).
  """
  sparsity = jnp.asarray(sparsity, jnp.float32)
  total = np.asarray(total, np.int64)
  n_hi = jnp.asarray(total >> 12, jnp.uint32)  # < 2**19
  n_lo = jnp.asarray(total & 4095, jnp.uint32)
  bits = lax.bitcast_convert_type(sparsity, jnp.uint32)
  biased = (bits >> 23).astype(jnp.int32)
  mantissa = (bits & 0x7FFFFF) | 0x800000
  m_hi, m_lo = mantissa >> 12, mantissa & 4095
  # P = n_hi m_hi 2**24 + (n_hi m_lo + n_lo m_hi) 2**12 + n_lo m_lo = p_hi 2**24 + p_lo.
  middle = n_hi * m_lo + n_lo * m_hi  # < 2**32
  low = n_lo * m_lo + ((middle & 4095) << 12)  # < 2**25
  p_hi = n_hi * m_hi + (middle >> 12) + (low >> 24)  # < 2**31
  p_lo = low & 0xFFFFFF
  q = 150 - biased  # s = M * 2**-q; q >= 24 for s < 1
  shift = jnp.clip(q - 24, 0, 31).astype(jnp.uint32)  # P >> q = p_hi >> (q - 24)
  floor = jnp.where(q - 24 > 31, jnp.uint32(0), p_hi >> shift)
  # The remainder P mod 2**q against half of 2**q: its top bit and the bits below it.
  top_shift = jnp.clip(q - 25, 0, 31).astype(jnp.uint32)
  below_mask = (jnp.uint32(1) << top_shift) - 1
  top = jnp.where(q == 24, p_lo >> 23, (p_hi >> top_shift) & 1)
  top = jnp.where(q - 25 > 30, jnp.uint32(0), top)
  rest = jnp.where(q == 24, (p_lo & 0x7FFFFF) != 0, ((p_hi & below_mask) != 0) | (p_lo != 0))
  rest = jnp.where(q - 25 > 30, (p_hi != 0) | (p_lo != 0), rest)
  kept = jnp.asarray(total, jnp.int32) - floor.astype(jnp.int32)
  # N - P / 2**q = (kept - 1) + (1 - remainder / 2**q): one less when the remainder is
  # above half of 2**q, or exactly half and kept is odd (half to even).
  down = (top == 1) & (rest | (kept % 2 == 1))
  kept = jnp.where(down, kept - 1, kept)
  kept = jnp.where(biased == 0, jnp.asarray(total, jnp.int32), kept)  # s = 0 (or subnormal)
  return jnp.maximum(kept, 1)


def exact_thresholds(layout: counting.Layout, maxima: Array, sparsity: Array, search: str) -> Array:
  """The k-th largest magnitude of every unit, k = exact_keep_count(N, sparsity); `mask = a >= it`.

  Per unit, searches the largest float32 bit pattern b with count(a >= float(b))
  >= k, which is the value a sort would put at position k - 1 from the top.
  The search first finds the cell of a uniform grid over [0, max] that holds the
  answer (from an estimate on every 16th row, then exact counts), then the bit
  pattern inside the cell. The fast count is exact above `numerics.TINY` (after
  scaling); a unit whose answer lies below it (almost all weights < 1e-30 of
  the largest) is searched by comparison instead.

  The fixed search searches a grid of 4,095 cells in three passes, then the bit
  patterns inside the cell in four passes and a loop for what is left (a cell
  of more than 2**16 bit patterns: an answer below 1/16 of the maximum).

  Args and Returns: as `histogram_thresholds`, without `nbins`.
  """
  sizes = layout.sizes()
  kept = exact_keep_count(sizes, sparsity)
  sample_kept = jnp.ceil(kept * jnp.asarray(layout.sizes(True) / sizes, jnp.float32)).astype(
    jnp.int32
  )
  scaling = _Scaling.of(layout, maxima)
  exponent, part_scales, scaled_max = scaling.exponent, scaling.part_scales, scaling.scaled_max
  tiny = jnp.float32(numerics.TINY)
  fixed = search == 'fixed'
  cells = _FIXED_GRID if fixed else _GRID

  def grid(j):
    # Non-decreasing in j; 0 -> 0 (count = N >= kept), cells + 1 -> inf (count 0).
    value = j.astype(jnp.float32) * (scaled_max[:, None] / cells)
    value = jnp.where(j > cells, jnp.float32(jnp.inf), jnp.maximum(value, tiny))
    return jnp.where(j <= 0, jnp.float32(0.0), value)

  def fewer_than(needed, sample):
    return lambda values, _, active: (
      counting.counts(layout, part_scales, values, sample, active=active) < needed[:, None]
    )

  lo = jnp.zeros((layout.num_units,), jnp.int32)
  hi = jnp.full((layout.num_units,), cells + 1, jnp.int32)
  if fixed:
    cell = fixed_first_reaching(
      grid, fewer_than(kept, False), lo, hi, passes_for(cells + 1), loop=False
    )
  else:
    guess = first_reaching(grid, fewer_than(sample_kept, True), lo, hi)
    cell = first_reaching(grid, fewer_than(kept, False), lo, hi, guess)
  # count(a >= grid(cell - 1)) >= kept > count(a >= grid(cell)). In cell 1 the lower
  # end is 0, and the fast count is exact only from `tiny` up: the search starts
  # just below tiny, and a result of "just below tiny" means the answer lies
  # below it, where a search by comparison takes over.
  below_tiny = numerics.as_key(tiny) - 1
  lower = jnp.where(cell == 1, below_tiny, numerics.as_key(grid(cell[:, None] - 1)[:, 0]))
  upper = jnp.where(
    cell > cells, numerics.as_key(scaled_max) + 1, numerics.as_key(grid(cell[:, None])[:, 0])
  )

  def fewer_keys(values, _, active):
    return counting.counts(layout, part_scales, values, active=active) < kept[:, None]

  def value(first_fewer):
    # The first key with count < kept, minus one, is the largest key with count >=
    # kept; scaling back by a power of two is exact: it is one of the magnitudes.
    # NaN marks an answer below tiny (the search's "just below tiny").
    key = first_fewer - 1
    return jnp.where(
      key == below_tiny, jnp.float32(jnp.nan), numerics.ldexp(numerics.as_value(key), exponent)
    )

  if fixed:
    fast = value(
      fixed_first_reaching(numerics.as_value, fewer_keys, lower, upper, _FIXED_KEY_PASSES)
    )
  else:
    fast = value(first_reaching(numerics.as_value, fewer_keys, lower, upper))

  def with_slow():
    slow = _slow_search(layout, part_scales, kept, exponent, fixed)
    return jnp.where(jnp.isnan(fast), slow, fast)

  return lax.cond(jnp.any(jnp.isnan(fast)), with_slow, lambda: fast)


def _slow_search(
  layout: counting.Layout,
  part_scales: Sequence[tuple[Array, Array]],
  kept: Array,
  exponent: Array,
  fixed: bool,
) -> Array:
  """The k-th largest value of each unit, given that it lies below TINY after scaling.

  Rare (almost all weights below 1e-30 of the largest): in the fixed search, one loop.
  """

  def fewer_keys(values, _, active):
    return (
      counting.counts(layout, part_scales, values, below_tiny=True, active=active) < kept[:, None]
    )

  lo = jnp.zeros((layout.num_units,), jnp.int32)
  hi = jnp.full((layout.num_units,), numerics.as_key(jnp.float32(numerics.TINY)))
  if fixed:
    key = fixed_first_reaching(numerics.as_value, fewer_keys, lo, hi, 0) - 1
  else:
    key = first_reaching(numerics.as_value, fewer_keys, lo, hi) - 1
  value = numerics.ldexp(numerics.as_value(key), exponent)
  # CPU XLA compares subnormals as zero, so the search cannot tell them from 0.
  return jnp.where(value < numerics.SMALLEST_NORMAL, jnp.float32(0.0), value)


def histogram_cdf(values: Array, value_max: float | Array, nbins: int) -> Array:
  """The CDF of |values| over `nbins` equal bins of [0, value_max] (reporting, tests).

  Values above the range land in the last bin, as in TF's
  `histogram_fixed_width`. Counts every bin edge in one pass.
  """
  magnitudes = jnp.abs(jnp.asarray(values, jnp.float32))
  value_max = jnp.asarray(value_max, jnp.float32)
  layout = counting.Layout((counting.Part(counting.WeightReader.of(magnitudes), magnitudes.shape),))
  _, scales = _scales(jnp.maximum(value_max, jnp.max(magnitudes))[None])
  scaled_max = value_max * scales[0][0] * scales[1][0]
  edges = bin_edge(jnp.arange(1, nbins, dtype=jnp.int32), scaled_max, nbins)
  total = magnitudes.size
  counts = total - counting.counts(layout, [scales], edges[None])[0]
  counts = jnp.concatenate([counts, jnp.array([total], jnp.int32)]).astype(jnp.float32)
  return numerics.div_rn(counts, jnp.float32(total))
