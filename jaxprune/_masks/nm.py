"""N:M semi-structured sparsity: keep n of every m consecutive weights.

jaxpruner's N:M pruning, and tfmot's `sparsity_m_by_n` with the count turned
around (tfmot's `(m, n)` zeroes m of every n; `N:M` here keeps N of every M;
2:4, the pattern sparse tensor cores accelerate, is the same in both). Along
the input-channel axis, split the weights into groups of `m` consecutive
entries and keep the `n` of largest magnitude in each group. For a Dense
kernel `(in, out)` the input-channel axis is 0; for a conv kernel
`(H, W, I, O)` it is -2; both are `axis=-2`, the default.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxprune._config.maps import parse_nm
from jaxprune._masks import ranking as ranking

__all__ = ['is_nm_sparse', 'nm_mask', 'nm_mask_from_scores']


def _check(shape: tuple[int, ...], n: int, m: int, axis: int, name: str | None) -> int:
  """Validates the arguments of `nm_mask`; returns `axis` made non-negative."""
  parse_nm((n, m))
  what = f'leaf {name!r} with shape {shape}' if name else f'weights with shape {shape}'
  if not shape:
    raise ValueError(f'N:M {n}:{m}: {what} is a scalar; N:M needs an axis to group along')
  if not -len(shape) <= axis < len(shape):
    raise ValueError(
      f'N:M {n}:{m}: axis={axis} is out of range for {what}; pass an axis in '
      f'[-{len(shape)}, {len(shape)})'
    )
  axis %= len(shape)
  if shape[axis] % m:
    raise ValueError(
      f'N:M {n}:{m}: {what}: axis {axis} has {shape[axis]} entries, '
      f'which is not divisible by M={m}; choose M dividing {shape[axis]}, '
      f'another axis, or leave this leaf out of the N:M pattern'
    )
  return axis


def nm_mask(
  weights: jax.Array, n: int, m: int, axis: int = -2, *, name: str | None = None
) -> jax.Array:
  """Keeps the `n` largest-magnitude entries of every `m` consecutive ones.

  Groups are `m` consecutive entries along `axis` (for every position on the
  other axes). Within a group, ties in magnitude go to the lower index (like
  `lax.top_k`), and NaN counts as the largest magnitude (kept), so each group
  keeps exactly `n` entries. Pure and jittable (`n`, `m`, `axis` are static).

  Args:
    weights: an array with at least one dimension, e.g. a Dense kernel
      `(in, out)` or a conv kernel `(H, W, in, out)`.
    n: entries kept per group, `1 <= n < m`.
    m: group size; `weights.shape[axis]` must be divisible by it.
    axis: the axis along which groups are formed; the default -2 is the
      input-channel axis of Dense and HWIO conv kernels.
    name: the leaf's name, used only in error messages.

  Returns:
    A bool mask with the shape of `weights`, True for kept entries.

  Raises:
    ValueError: if `weights.shape[axis]` is not divisible by `m`, `axis` is out
      of range, or `n`, `m` are invalid.

  Example:
    >>> import jax.numpy as jnp, jaxprune
    >>> kernel = jnp.array([[0.1], [-0.9], [0.5], [0.2]])  # (in, out): groups run along `in`
    >>> jaxprune.nm_mask(kernel, 2, 4).ravel()
    Array([False,  True,  True, False], dtype=bool)
  """
  if m > _COMPARED_M:
    return nm_mask_from_scores(nan_largest_magnitudes(weights), n, m, axis, name=name)
  axis = _check(tuple(weights.shape), n, m, axis, name)
  return _highest_by_comparison(weights, n, m, axis)


def nan_largest_magnitudes(weights: jax.Array) -> jax.Array:
  """|w|, with NaN as the largest magnitude (+inf): the scores N:M masks rank."""
  magnitudes = jnp.abs(weights)
  if jnp.issubdtype(magnitudes.dtype, jnp.inexact):
    magnitudes = jnp.where(jnp.isnan(magnitudes), jnp.inf, magnitudes)
  return magnitudes


# Up to this group size, `nm_mask` ranks each group by comparing its members pairwise.
_COMPARED_M = 32


def _highest_by_comparison(weights: jax.Array, n: int, m: int, axis: int) -> jax.Array:
  """`nm_mask_from_scores` of the weights' `nan_largest_magnitudes`, in place.

  An entry's rank is the number of members of its group above it, or equal to it at
  a lower index, and it is kept when that is below `n`: the sort's order, with no
  transpose, no sort and no index arrays (two int32 arrays the size of the weights).
  Member `i` meets member `(i + d) % m` in the group rolled by `d`; that member has the
  lower index when the roll wrapped (`i >= m - d`). Every entry reads its group through
  `m - 1` rolls, so XLA computes the magnitudes where they are compared (ranked member
  by member, the weights were read too often in one kernel and stored).
  """
  shape = weights.shape
  groups = weights.reshape(shape[:axis] + (shape[axis] // m, m) + shape[axis + 1 :])
  me = nan_largest_magnitudes(groups)
  index = lax.broadcasted_iota(jnp.int32, groups.shape, axis + 1)
  rank = jnp.zeros(groups.shape, jnp.int32)
  for d in range(1, m):
    other = nan_largest_magnitudes(jnp.roll(groups, -d, axis=axis + 1))
    above = jnp.where(index >= m - d, other >= me, other > me)
    rank = rank + above.astype(jnp.int32)
  return (rank < n).reshape(shape)


def nm_mask_from_scores(
  scores: jax.Array, n: int, m: int, axis: int = -2, *, name: str | None = None
) -> jax.Array:
  """Keeps the `n` highest `scores` of every `m` consecutive ones along `axis`.

  `nm_mask` with the ranking given by `scores` instead of magnitudes (ties go
  to the lower index: `jaxprune._masks.ranking`'s rule), for criteria other than magnitude.

  Args:
    scores: real array; higher means more important.
    n: entries kept per group, `1 <= n < m`.
    m: group size; `scores.shape[axis]` must be divisible by it.
    axis: the grouping axis, as in `nm_mask`.
    name: the leaf's name, used only in error messages.

  Returns:
    A bool mask with the shape of `scores`.
  """
  axis = _check(tuple(scores.shape), n, m, axis, name)
  moved = jnp.moveaxis(scores, axis, -1)
  groups = moved.reshape(*moved.shape[:-1], moved.shape[-1] // m, m)
  keep = ranking.highest_k(groups, n, axis=-1).reshape(moved.shape)
  return jnp.moveaxis(keep, -1, axis)


def is_nm_sparse(x: jax.Array, n: int, m: int, axis: int = -2) -> jax.Array:
  """Whether every group of `m` consecutive entries along `axis` has at most `n` nonzeros.

  Args:
    x: weights or a mask (nonzero / True counts as kept).
    n: the most nonzeros allowed per group.
    m: group size; `x.shape[axis]` must be divisible by it.
    axis: the grouping axis, as in `nm_mask`.

  Returns:
    A bool scalar array.
  """
  axis = _check(tuple(x.shape), n, m, axis, None)
  nonzero = jnp.moveaxis(x != 0, axis, -1)
  groups = nonzero.reshape(*nonzero.shape[:-1], nonzero.shape[-1] // m, m)
  return jnp.all(jnp.sum(groups, axis=-1) <= n)
