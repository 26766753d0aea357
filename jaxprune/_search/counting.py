"""Exact counting passes over the magnitudes of many variables at once.

A threshold search (`thresholds`) asks, for each unit (a variable, a stacked
layer, or all variables under global pruning) and J candidate thresholds, how
many magnitudes reach each candidate. `counts` answers for every unit in one
pass over the weights, recomputing the magnitudes as it reads them (`Part`),
so that no full-size copy of them is ever stored.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array, lax

from jaxprune import _numerics as numerics

SAMPLE_STRIDE = 16  # rows of the searches' estimates


def read_in_pass(arrays: Any, pass_value: Any) -> Any:
  """`arrays` behind an optimization barrier shared with `pass_value`, a value of the
  counting pass that reads them (its candidate thresholds, its index), or None (a read
  of its own).

  A compiler device, not arithmetic: values computed from the result depend on the pass,
  so inside a search loop XLA cannot hoist |w| (or params + updates) out of the loop and
  store it, and passes with different values share nothing. Each pass then reads the
  weights in its own kernels and keeps no full-size temporary.
  """
  if pass_value is None:
    return lax.optimization_barrier(arrays)
  return lax.optimization_barrier((arrays, pass_value))[0]


@dataclasses.dataclass(frozen=True)
class WeightReader:
  """A pruned leaf's weights as a mask update reads them: `reader()` is the array.

  Why not the array itself: a mask update searches its thresholds in several counting
  passes over the weights, and XLA would compute an array handed to it once (in the
  chained form, params + updates as `optax.apply_updates` stores them) and store it for
  every pass, a weights-sized temporary per pruned leaf. Each pass instead calls
  `reader(pass_value)`, which reads the weights behind an optimization barrier tied to
  that pass (`read_in_pass`), so XLA recomputes them inside the pass's kernels. A
  `jaxprune.MaskRule` that reads each leaf once can call `reader()`; one that thresholds
  arrays it derives from the weights wraps them with `WeightReader.of`.

  Attributes:
    read: `pass_value -> array`, the weights read in the pass of `pass_value` (see
      `read_in_pass`); None reads them once, outside any pass.
  """

  read: Callable[[Any], Array]

  @classmethod
  def of(cls, array: Array) -> WeightReader:
    """A reader of an array already computed.

    Args:
      array: e.g. scores a rule derived from `reader()` of the leaves.

    Returns:
      The reader; each pass reads `array` through `read_in_pass`.
    """
    return cls(functools.partial(read_in_pass, array))

  def __call__(self, pass_value: Any = None) -> Array:
    """The weights, read in a counting pass.

    Args:
      pass_value: a value of the counting pass that reads them; None (the default) for
        a read outside any pass, which is all a rule that reads each leaf once needs.

    Returns:
      The leaf's array.
    """
    return self.read(pass_value)


@dataclasses.dataclass(frozen=True)
class Part:
  """The magnitudes of one variable, as seen by a threshold search.

  Attributes:
    values: `pass_value -> float32 array >= 0`, called in every counting pass with
      that pass's candidate thresholds as `pass_value`. It should read the weights
      through `read_in_pass(..., pass_value)`, so that XLA recomputes the magnitudes (|w|,
      or |params + updates|) in each pass instead of keeping a copy of them.
    shape: the shape of `values(...)`.
    unit_axes: how many leading axes index units (stacked layers); 0 when
      the whole array belongs to one unit.
    signed: optionally, `pass_value -> array` of the values before their magnitude is
      taken (the weights), for the finiteness check of `part_maxima`.
  """

  values: Callable[[Any], Array]
  shape: tuple[int, ...]
  unit_axes: int = 0
  signed: Callable[[Any], Array] | None = None

  @property
  def num_units(self) -> int:
    return math.prod(self.shape[: self.unit_axes])


@dataclasses.dataclass(frozen=True)
class Layout:
  """Which units the parts' values belong to.

  Without `shared`, part i owns its own units (one, or one per stacked layer),
  numbered after those of the parts before it; with `shared` all parts form
  one unit (global pruning) and must have no unit axes.
  """

  parts: tuple[Part, ...]
  shared: bool = False

  def __post_init__(self):
    if self.shared and any(p.unit_axes for p in self.parts):
      raise ValueError('parts of one shared unit need unit_axes=0.')

  @property
  def num_units(self) -> int:
    return 1 if self.shared else sum(p.num_units for p in self.parts)

  def pieces(self, per_unit: Array) -> list[Array]:
    """Each part's rows of a (units, ...) array."""
    if self.shared:
      return [per_unit] * len(self.parts)
    units = per_unit.shape[0]
    rows = []
    starts = np.cumsum([0] + [p.num_units for p in self.parts])[:-1]
    for start, part in zip(starts, self.parts, strict=True):
      # The window of _WINDOW units around the part (all units, when there are few).
      lo = start // _WINDOW * _WINDOW
      hi = min(units, -(-(start + part.num_units) // _WINDOW) * _WINDOW)
      window = per_unit if (lo, hi) == (0, units) else per_unit[lo:hi]
      rows.append(_rows(window, int(start - lo), part.num_units))
    return rows

  def sizes(self, sample: bool = False) -> np.ndarray:
    """Elements per unit that a (sampled) counting pass sees (static)."""
    per_part = []
    for part in self.parts:
      shape = rows_shape(part.shape, part.unit_axes)
      rows = math.ceil(shape[-2] / SAMPLE_STRIDE) if sample else shape[-2]
      per_part.append(
        np.full(part.num_units, math.prod(shape[part.unit_axes : -2]) * rows * shape[-1], np.int64)
      )
    sizes = sum(per_part) if self.shared else np.concatenate(per_part)
    if sizes.max() > np.iinfo(np.int32).max:
      raise ValueError(
        f'a threshold spans {sizes.max()} weights; counts are int32, so one '
        'variable, layer or global set may hold at most 2**31 - 1 weights.'
      )
    return sizes


_SELECT_WIDTH = 32  # XLA:CPU splits a reduction over a longer axis into windows
# Units a part's rows are selected from: a selection reads all of them, so many units
# are first sliced into windows of this many (one slice per window, shared by its parts).
_WINDOW = 256


def _rows(per_unit: Array, start: int, count: int) -> Array:
  """per_unit[start : start + count], exactly, selected by a constant mask and a max.

  A slice's bounds are part of the code XLA compiles for it (as is a gather's at
  constant indices, which XLA turns into a slice), so the slices of parts at different
  offsets are different kernels, each compiled on its own; a mask is an operand, so
  the selections of all parts of one size are one kernel, compiled once. The units
  axis is read as (groups, 32), so that XLA keeps the reduction in one kernel.
  """
  groups = -(-per_unit.shape[0] // _SELECT_WIDTH)
  select = np.zeros((count, groups * _SELECT_WIDTH), bool)
  select[np.arange(count), start + np.arange(count)] = True
  return _selected(per_unit, select.reshape(count, groups, _SELECT_WIDTH))


@jax.jit
def _selected(per_unit: Array, select: Array) -> Array:
  """`_rows`' selection, traced (and lowered) once per shape: the mask is an argument."""
  units, tail = per_unit.shape[0], per_unit.shape[1:]
  count, groups, width = select.shape
  shape = (count, groups, width) + tail
  select = lax.broadcast_in_dim(select, shape, (0, 1, 2))
  # As unsigned bit patterns: the largest of one entry and zeros is that entry, whatever
  # it holds.
  bits = per_unit if per_unit.dtype == jnp.bool_ else lax.bitcast_convert_type(per_unit, jnp.uint32)
  zero = np.zeros((), bits.dtype)
  bits = lax.pad(bits, zero, [(0, groups * width - units, 0)] + [(0, 0, 0)] * len(tail))
  bits = lax.broadcast_in_dim(lax.reshape(bits, shape[1:]), shape, tuple(range(1, len(shape))))
  picked = lax.select(select, bits, lax.full(shape, zero))
  if per_unit.dtype == jnp.bool_:
    return lax.reduce_or(picked, (1, 2))
  return lax.bitcast_convert_type(lax.reduce_max(picked, (1, 2)), per_unit.dtype)


def rows_shape(shape: Sequence[int], unit_axes: int) -> tuple[int, ...]:
  """The shape counting passes view an array in: its last axis short enough to be
  summed exactly in float32, at least two axes after the unit axes.

  Arrays with two or more axes after the unit axes keep their shape, so a
  tensor sharded along any axis is counted where it lives (a reshape could
  gather it); one-axis data is folded into rows.
  """
  shape = tuple(shape)
  if len(shape) - unit_axes >= 2 and shape[-1] <= 2**24:
    return shape
  size = math.prod(shape[unit_axes:])
  width = next((w for w in (4096, 1024, 256, 64, 16, 4, 2) if size % w == 0), 1)
  return shape[:unit_axes] + (size // width, width)


def unit_shaped(part: Part, per_unit: Array, ndim: int) -> Array:
  """A (units, *tail) array shaped to broadcast against an ndim array of the part:
  unit axes first, then ones, then the tail."""
  tail = per_unit.shape[1:]
  lead = part.shape[: part.unit_axes]
  return per_unit.reshape(lead + (1,) * (ndim - part.unit_axes - len(tail)) + tail)


def _part_counts(
  part: Part,
  scale: tuple[Array, Array],
  thresholds: Array,
  sample: bool,
  below_tiny: bool = False,
  index: int = 0,
) -> Array:
  """(units of the part, J) int32 counts of `values * scale >= threshold`, minus the size.

  With `below_tiny`, thresholds lie below numerics.TINY (after scaling), where
  float differences may flush to zero on CPU: values are capped just below TINY
  and both sides lifted by 2**100 (exact), so differences stay normal.
  """
  # The thresholds and the scale through a barrier of this pass and part: their broadcasts
  # to the weights' shape would otherwise be instructions shared by every pass (and, under
  # one global threshold, every part of a shape), and XLA:CPU stores a broadcast that its
  # library reductions share (a weights-sized buffer) rather than compute it in each.
  thresholds, scale = read_in_pass((thresholds, scale), jnp.int32(index))
  return _counted(
    part.values(thresholds),
    thresholds,
    scale,
    part.shape,
    part.unit_axes,
    sample,
    below_tiny,
    _float_counts(part, sample),
  )


@functools.partial(jax.jit, static_argnums=(3, 4, 5, 6, 7))
def _counted(
  values: Array,
  thresholds: Array,
  scale: tuple[Array, Array],
  shape: tuple[int, ...],
  unit_axes: int,
  sample: bool,
  below_tiny: bool,
  float_counts: bool,
) -> Array:
  """`_part_counts` once the values are read: traced (and lowered) once per shape."""
  part = Part(None, shape, unit_axes)
  rows = values.reshape(rows_shape(shape, unit_axes))
  if sample:
    rows = rows[..., ::SAMPLE_STRIDE, :]
  probes = unit_shaped(part, thresholds, rows.ndim)[..., None]  # (..., J, 1)
  first, second = (unit_shaped(part, factor[:, None], rows.ndim) for factor in scale)
  scaled = rows * first * second
  if below_tiny:
    # The constants through the barrier as well, for the same reason.
    cap, lift = read_in_pass(
      (numerics.step_ulps(jnp.float32(numerics.TINY), -1), jnp.float32(2.0**100)), thresholds
    )
    scaled = jnp.minimum(scaled, cap) * lift
    probes = probes * lift
  # floor(v - t) is -1 below t and 0 above, for v and t in [0, 1): see numerics.
  flags = jnp.floor(scaled[..., None, :] - probes)
  row_axes = tuple(range(unit_axes, rows.ndim - 1))
  if float_counts:
    # A float32 sum of at most 2**24 ones is exact in any order: one reduction, whose
    # result `counts` converts to int32 once for all parts.
    below = jnp.sum(flags, axis=row_axes + (rows.ndim,))
  else:
    below = jnp.sum(jnp.sum(flags, axis=-1).astype(jnp.int32), axis=row_axes)
  return below.reshape(part.num_units, -1)


def _float_counts(part: Part, sample: bool) -> bool:
  """Whether a part's counts are exact float32 sums (at most 2**24 values per unit)."""
  shape = rows_shape(part.shape, part.unit_axes)
  rows = math.ceil(shape[-2] / SAMPLE_STRIDE) if sample else shape[-2]
  return math.prod(shape[part.unit_axes : -2]) * rows * shape[-1] <= 2**24


def counts(
  layout: Layout,
  scales: Sequence[tuple[Array, Array]],
  thresholds: Array,
  sample: bool = False,
  below_tiny: bool = False,
  active: Array | None = None,
) -> Array:
  """Exact int32 `count(values * scale >= threshold)` per unit and candidate.

  Args:
    layout: the parts.
    scales: per part, two (units of the part,) float32 powers of two whose product
      maps each unit into [0, 1).
    thresholds: (units, J) float32 candidates, each 0 or >= numerics.TINY
      (below it with `below_tiny`).
    sample: count every 16th row only.
    below_tiny: count at thresholds below numerics.TINY.
    active: optional (units,) bools: a part none of whose units is active is not
      read (its rows of the result are then meaningless). A search skips the
      units it has settled, most of them after its first pass.

  Returns:
    (units, J) int32.
  """
  pieces = layout.pieces(thresholds)
  flags = [None] * len(layout.parts) if active is None else layout.pieces(active[:, None])

  def part_counts(index, part, scale, probes, flag):
    count = functools.partial(_part_counts, part, scale, probes, sample, below_tiny, index)
    if flag is None:
      return count()
    if _float_counts(part, sample):
      # A settled part's counts are not used: the skipping branch returns the candidates
      # (a copy, where zeros were a kernel of their own).
      return lax.cond(jnp.any(flag), count, lambda: probes)
    return lax.cond(
      jnp.any(flag), count, lambda: jnp.zeros((part.num_units, probes.shape[-1]), jnp.int32)
    )

  below = [
    part_counts(i, *args)
    for i, args in enumerate(zip(layout.parts, scales, pieces, flags, strict=True))
  ]
  if layout.shared:  # the parts' counts of one unit add up, in int32
    below = sum(b.astype(jnp.int32) for b in below)
  else:
    # Float counts are joined (and converted) in one kernel: a part counted in int32
    # takes zeros there and its counts join the float ones as a second array.
    below = jnp.concatenate(
      [b if b.dtype == jnp.float32 else jnp.zeros(b.shape, jnp.float32) for b in below]
    ).astype(jnp.int32) + jnp.concatenate(
      [b if b.dtype == jnp.int32 else jnp.zeros(b.shape, jnp.int32) for b in below]
    )
  return jnp.asarray(layout.sizes(sample), jnp.int32)[:, None] + below


def part_maxima(layout: Layout) -> list[tuple[Array, Array]]:
  """Per part, (a sum per unit that is finite exactly when the unit holds no NaN or Inf,
  its units' max(values)); `joined_maxima` makes them one (units,) array.

  A backend's max may drop NaN (XLA:CPU does in arrays of 4096 or more elements); a sum
  keeps it: the sum of `signed - signed` is NaN exactly when a value is NaN or infinite. It
  reads the signed values, not their magnitudes, so that XLA:CPU computes |w| in the
  max's reduction instead of storing it for both.
  """
  reductions = []
  for part in layout.parts:
    signed = (part.signed or part.values)(jnp.zeros((), jnp.int32))  # a read of its own
    reductions.append(_sum_and_max(signed, part.values(None), part.unit_axes))
  return reductions


def joined_maxima(reductions: Sequence[tuple[Array, Array]]) -> Array:
  """max(values) of every unit (the parts' own, `shared` aside), float32, in one (units,)
  array, from `part_maxima`'s results; Inf where a NaN or an Inf is."""
  sums, maxima = zip(*reductions, strict=True)
  return jnp.where(jnp.isfinite(jnp.concatenate(sums)), jnp.concatenate(maxima), jnp.inf)


@functools.partial(jax.jit, static_argnums=2)
def _sum_and_max(signed: Array, values: Array, unit_axes: int) -> tuple[Array, Array]:
  """`part_maxima` of one part (traced once per shape)."""
  axes = tuple(range(unit_axes, values.ndim))
  signed = signed.astype(jnp.float32)
  return jnp.sum(signed - signed, axis=axes).reshape(-1), jnp.max(values, axis=axes).reshape(-1)
