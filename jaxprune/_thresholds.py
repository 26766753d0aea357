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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import Array, lax

from jaxprune import _counting as counting
from jaxprune import _numerics as numerics

_EDGE_SEARCH_ULPS = 4
_GRID = 4096  # cells of [0, max] that bracket the exact search
# Candidate thresholds per unit and pass. A pass costs about (1 + 0.4 * PROBES)
# max passes on CPU; with the sampled estimate two settle most searches in one.
PROBES = 2
_EDGE_TABLE_MAX = 4096  # bins: larger counts compute each edge where it is used

def _scales(value_max: Array) -> tuple[Array, Array]:
  """(exponent e, (units, 2) powers of two) with values * 2**-e in [0, 1), exactly.

  Two normal powers of two: a single 2**-128 would be subnormal, i.e. zero.
  """
  exponent = numerics.count_exponent(value_max)
  half = exponent // 2
  factors = jnp.stack([numerics.power_of_two(-half), numerics.power_of_two(half - exponent)],
                      axis=-1)
  return exponent, factors


@dataclasses.dataclass(frozen=True)
class _Scaling:
  """The units' maxima and the exact scaling that maps each unit into [0, 1).

  Each part's factors come from its own maxima (not sliced out of the units'),
  so that no part's arithmetic is copied into another's.
  """
  value_max: Array  # (units,)
  exponent: Array  # (units,)
  scaled_max: Array  # (units,), in [0.5, 1)
  part_scales: list[Array]  # per part, (units of the part, 2)

  @classmethod
  def of(cls, layout: counting.Layout, maxima: Sequence[Array]) -> _Scaling:
    """`maxima`: per part, or one (1,) array for a shared layout; finite and > 0."""
    per_part = [_scales(m) for m in maxima]
    exponent = jnp.concatenate([e for e, _ in per_part])
    factors = jnp.concatenate([f for _, f in per_part])
    part_scales = [per_part[0][1]] * len(layout.parts) if layout.shared else [
        f for _, f in per_part]
    value_max = jnp.concatenate(list(maxima))
    return cls(value_max, exponent, value_max * factors[:, 0] * factors[:, 1], part_scales)


def bin_edge(k: Array, value_max: Array, nbins: int) -> Array:
  """The smallest float32 a >= 0 whose bin, floor(nbins * (a / m)), is >= k (elementwise).

  So `bin(a) >= k` exactly when `a >= bin_edge(k)`. The edge is within a few
  ulps of k * m / nbins; the neighbours are checked with the exact rule.
  """
  k, value_max = jnp.broadcast_arrays(jnp.asarray(k, jnp.float32),
                                      jnp.asarray(value_max, jnp.float32))
  guess = numerics.div_rn(k, jnp.float32(nbins)) * value_max
  # The candidates along a last axis, lowest first, checked in one pass: the edge is the
  # lowest one in a bin >= k (the lowest candidate when none is).
  offsets = jnp.arange(-_EDGE_SEARCH_ULPS, _EDGE_SEARCH_ULPS + 1, dtype=jnp.int32)
  candidates = numerics.step_ulps(guess[..., None], offsets)
  in_bin = jnp.float32(nbins) * numerics.div_rn(candidates, value_max[..., None]) >= k[..., None]
  lowest = jnp.min(jnp.where(in_bin, candidates, jnp.inf), axis=-1)
  return jnp.where(jnp.any(in_bin, axis=-1), lowest, candidates[..., 0])


def _first_reaching(thresholds_of: Callable[[Array], Array],
                    reaches: Callable[[Array, Array, Array], Array], lo: Array, hi: Array,
                    guess: Array | None = None,
                    finish: tuple[Callable[[Array], Array], counting.Layout] | None = None
                    ) -> Array | list[Array]:
  """Per unit, the first k in (lo, hi] with reaches(k), given not reaches(lo), reaches(hi).

  Candidates k are (units, J) int32; `thresholds_of(k)` maps them to the
  float32 values to count at, and `reaches(thresholds, k, active)` to (units, J)
  bools with one counting pass over the parts that hold an `active` unit (one
  still searching; the others' answers are ignored, as their bracket is closed).
  With a guess, the first pass probes the J candidates ending at the guess (a
  right guess finishes there), and the next ones gallop away from it by 1, 2,
  3 ... then 3, 6, 9 ... candidates; otherwise (and once the gallop spans the
  bracket) each pass splits (lo, hi) into J + 1 parts.

  The next pass's thresholds are computed at the end of a pass and carried by
  the loop, so every part reads one stored array (XLA would otherwise copy
  their arithmetic into each part's pass). With `finish = (f, layout)` the loop
  also carries f(hi) split into each part's units, and returns that list: XLA
  compiles the code that uses a part's own buffer once for all parts of its
  shapes, but code that slices a shared one once per part.
  """
  offsets = jnp.arange(1, PROBES + 1, dtype=jnp.int32)

  def candidates_of(lo, hi, reach, first):
    # lo + ceil((hi - lo) * j / (J + 1)) for j = 1..J, without int32 overflow.
    quotient, remainder = jnp.divmod((hi - lo)[:, None], PROBES + 1)
    candidates = lo[:, None] + quotient * offsets + (remainder * offsets + PROBES) // (PROBES + 1)
    if guess is not None:
      ahead = reach[:, None] * offsets
      up = (lo >= guess) & (lo + reach * PROBES < hi)
      down = (hi < guess) & (hi - reach * PROBES > lo)
      candidates = jnp.where(up[:, None], lo[:, None] + ahead, candidates)
      candidates = jnp.where(down[:, None], hi[:, None] - ahead, candidates)
      candidates = jnp.where(first, guess[:, None] - PROBES + offsets, candidates)
    return jnp.clip(candidates, lo[:, None] + 1, jnp.maximum(hi[:, None] - 1, lo[:, None] + 1))

  def finished(hi):
    if finish is None:
      return []
    f, layout = finish
    return layout.pieces(f(hi))

  def step(state):
    lo, hi, reach, candidates, thresholds, _ = state
    ok = reaches(thresholds, candidates, hi - lo > 1)
    lo = jnp.maximum(lo, jnp.max(jnp.where(ok, lo[:, None], candidates), axis=1))
    hi = jnp.minimum(hi, jnp.min(jnp.where(ok, candidates, hi[:, None]), axis=1))
    candidates = candidates_of(lo, hi, reach, False)
    reach = jnp.minimum(reach * (PROBES + 1), 2 ** 20)
    return lo, hi, reach, candidates, thresholds_of(candidates), finished(hi)

  candidates = candidates_of(lo, hi, jnp.ones_like(lo), True)
  # The results start as placeholders: the loop runs at least once.
  placeholders = jax.eval_shape(finished, hi)
  state = (lo, hi, jnp.ones_like(lo), candidates, thresholds_of(candidates),
           [jnp.zeros(x.shape, x.dtype) for x in placeholders])
  state = lax.while_loop(lambda s: jnp.any(s[1] - s[0] > 1) | (s[2][0] == 1), step, state)
  return state[1] if finish is None else state[-1]


def histogram_thresholds(layout: counting.Layout, maxima: Sequence[Array], sparsity: Array,
                         nbins: int) -> list[Array]:
  """TF's histogram threshold of every unit, given its maximum > 0.

  Returns (number of bins whose CDF is below the unit's sparsity) / nbins * max:
  the lower edge of the first bin whose CDF reaches the sparsity
  (docs/explanation/semantics.md#histogram-thresholds).

  Args:
    layout: the parts and their units.
    maxima: per part, (units of the part,) float32 maxima, finite and > 0; for a
      shared layout, one (1,) array.
    sparsity: (units,) float32 targets in [0, 1).
    nbins: histogram bins.

  Returns:
    Per part, (units of the part,) float32 thresholds; for a shared layout the
    same (1,) array for every part.
  """
  scaling = _Scaling.of(layout, maxima)

  # cdf[k] = count(bin <= k) / N, and bin <= k  <=>  a < edge(k + 1); edges are
  # >= max / nbins, far above numerics.TINY after scaling. Quotients a / max are
  # the same after exact scaling, and in [0.5, 1) the error-free products of
  # the edge search neither overflow nor underflow. For the usual bin counts a
  # (units, nbins + 1) table is made once: traced into every search body,
  # `bin_edge` dominated compile time.
  if nbins <= _EDGE_TABLE_MAX:
    table = bin_edge(jnp.arange(nbins + 1, dtype=jnp.int32)[None, :],
                     scaling.scaled_max[:, None], nbins)

    def edges(k):
      return jnp.take_along_axis(table, jnp.clip(k + 1, 0, nbins), axis=1)
  else:
    def edges(k):
      return bin_edge(k + 1, scaling.scaled_max[:, None], nbins)

  def reaches_on(sample):
    total = jnp.asarray(layout.sizes(sample), jnp.int32)[:, None]

    def reaches(thresholds, k, active):
      count_le = total - counting.counts(layout, scaling.part_scales, thresholds, sample,
                                         active=active)
      count_le = jnp.where(k >= nbins - 1, total, count_le)
      cdf = numerics.div_rn(count_le.astype(jnp.float32), total.astype(jnp.float32))
      return (k >= 0) & (cdf >= sparsity[:, None])
    return reaches

  def threshold(first):
    return numerics.div_rn(first.astype(jnp.float32), jnp.float32(nbins)) * scaling.value_max

  lo = jnp.full((layout.num_units,), -1, jnp.int32)
  hi = jnp.full((layout.num_units,), nbins - 1, jnp.int32)
  guess = _first_reaching(edges, reaches_on(True), lo, hi)
  return _first_reaching(edges, reaches_on(False), lo, hi, guess, finish=(threshold, layout))


def keep_count(total: Array | int, sparsity: Array) -> Array:
  """tfmot's rule: k = max(round(N * (1 - s)), 1), in float32, half to even."""
  kept = jnp.round(jnp.asarray(total, jnp.float32) * (jnp.float32(1.0) - sparsity))
  return jnp.maximum(kept, 1.0).astype(jnp.int32)


def exact_thresholds(layout: counting.Layout, maxima: Sequence[Array], sparsity: Array
                     ) -> list[Array]:
  """The k-th largest magnitude of every unit, k = keep_count(N, sparsity); `mask = a >= it`.

  Per unit, searches the largest float32 bit pattern b with count(a >= float(b))
  >= k, which is the value a sort would put at position k - 1 from the top.
  The search first finds the cell of a uniform grid over [0, max] that holds the
  answer (from an estimate on every 16th row, then exact counts), then the bit
  pattern inside the cell. The fast count is exact above `numerics.TINY` (after
  scaling); a unit whose answer lies below it (almost all weights < 1e-30 of
  the largest) is searched by comparison instead.

  Args and Returns: as `histogram_thresholds`, without `nbins`.
  """
  sizes = layout.sizes()
  kept = keep_count(sizes, sparsity)
  sample_kept = jnp.ceil(kept * jnp.asarray(layout.sizes(True) / sizes, jnp.float32)
                         ).astype(jnp.int32)
  scaling = _Scaling.of(layout, maxima)
  exponent, part_scales, scaled_max = scaling.exponent, scaling.part_scales, scaling.scaled_max
  tiny = jnp.float32(numerics.TINY)

  def grid(j):
    # Non-decreasing in j; 0 -> 0 (count = N >= kept), GRID + 1 -> inf (count 0).
    value = j.astype(jnp.float32) * (scaled_max[:, None] / _GRID)
    value = jnp.where(j > _GRID, jnp.float32(jnp.inf), jnp.maximum(value, tiny))
    return jnp.where(j <= 0, jnp.float32(0.0), value)

  def fewer_than(needed, sample):
    return lambda values, _, active: counting.counts(
        layout, part_scales, values, sample, active=active) < needed[:, None]

  lo = jnp.zeros((layout.num_units,), jnp.int32)
  hi = jnp.full((layout.num_units,), _GRID + 1, jnp.int32)
  guess = _first_reaching(grid, fewer_than(sample_kept, True), lo, hi)
  cell = _first_reaching(grid, fewer_than(kept, False), lo, hi, guess)
  # count(a >= grid(cell - 1)) >= kept > count(a >= grid(cell)). In cell 1 the lower
  # end is 0, and the fast count is exact only from `tiny` up: the search starts
  # just below tiny, and a result of "just below tiny" means the answer lies
  # below it, where a search by comparison takes over.
  below_tiny = numerics.as_key(tiny) - 1
  lower = jnp.where(cell == 1, below_tiny, numerics.as_key(grid(cell[:, None] - 1)[:, 0]))
  upper = jnp.where(cell > _GRID, numerics.as_key(scaled_max) + 1,
                    numerics.as_key(grid(cell[:, None])[:, 0]))

  def fewer_keys(values, _, active):
    return counting.counts(layout, part_scales, values, active=active) < kept[:, None]

  def value(first_fewer):
    # The first key with count < kept, minus one, is the largest key with count >=
    # kept; scaling back by a power of two is exact: it is one of the magnitudes.
    # NaN marks an answer below tiny (the search's "just below tiny").
    key = first_fewer - 1
    return jnp.where(key == below_tiny, jnp.float32(jnp.nan),
                     numerics.ldexp(numerics.as_value(key), exponent))

  fast = _first_reaching(numerics.as_value, fewer_keys, lower, upper, finish=(value, layout))

  def with_slow():
    slow = layout.pieces(_slow_search(layout, part_scales, kept, exponent))
    return [jnp.where(jnp.isnan(f), v, f) for v, f in zip(slow, fast, strict=True)]

  any_slow = jnp.any(jnp.isnan(jnp.concatenate(fast)))
  return lax.cond(any_slow, with_slow, lambda: fast)


def _slow_search(layout: counting.Layout, part_scales: Sequence[Array], kept: Array,
                 exponent: Array) -> Array:
  """The k-th largest value of each unit, given that it lies below TINY after scaling."""
  def fewer_keys(values, _, active):
    return counting.counts(layout, part_scales, values, below_tiny=True,
                           active=active) < kept[:, None]

  lo = jnp.zeros((layout.num_units,), jnp.int32)
  hi = jnp.full((layout.num_units,), numerics.as_key(jnp.float32(numerics.TINY)))
  key = _first_reaching(numerics.as_value, fewer_keys, lo, hi) - 1
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
  layout = counting.Layout((counting.Part(lambda token: counting.fresh(magnitudes, token),
                                          magnitudes.shape),))
  _, scales = _scales(jnp.maximum(value_max, jnp.max(magnitudes))[None])
  scaled_max = value_max * scales[0, 0] * scales[0, 1]
  edges = bin_edge(jnp.arange(1, nbins, dtype=jnp.int32), scaled_max, nbins)
  total = magnitudes.size
  counts = total - counting.counts(layout, [scales], edges[None])[0]
  counts = jnp.concatenate([counts, jnp.array([total], jnp.int32)]).astype(jnp.float32)
  return numerics.div_rn(counts, jnp.float32(total))
