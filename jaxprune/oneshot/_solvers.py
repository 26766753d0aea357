"""The per-layer rules on a weight matrix `W` of shape (outputs, inputs), jitted per shape.

Masks are bool, True for kept weights. A target sparsity `s` prunes `round(s * size)`
entries of each layer, however they are compared (per row, per block: see `_row_counts`
and `sparsegpt`); among equal scores the lower index is pruned first
(`ranking.lowest_k_stable`, the tie order of Wanda's reference code, which the tests
match). `nm=(n, m)` keeps `n` of every `m` consecutive inputs of each output row instead.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxprune._masks import nm as nm_lib
from jaxprune._masks import ranking as ranking
from jaxprune._transform.updates import zeroed

_HIGHEST = jax.lax.Precision.HIGHEST


def _select(
  scores: jax.Array, sparsity: float, nm: tuple[int, int] | None, per_row: bool
) -> jax.Array:
  if nm is not None:
    return nm_lib.nm_mask_from_scores(scores, nm[0], nm[1], axis=-1)
  if per_row:
    return ~ranking.lowest_k_stable(scores, _row_counts(scores, sparsity), axis=1)
  return ~ranking.lowest_k_stable(scores, round(sparsity * scores.size))


def _row_counts(scores: jax.Array, sparsity: float) -> jax.Array | int:
  """How many entries each output row prunes: `round(s * size)` in all, as the layer's
  target asks, `floor` of it per row and one more in the rows whose next candidate scores
  lowest (ties: the lower row). Where `s * inputs` is whole every row prunes that many;
  otherwise rounding each row alone could leave the layer far off its target (a 3x3
  kernel of one input feature: 4 of 9 per row is 44.4%, not 50%)."""
  rows, size = scores.shape[0], scores.size
  total = round(sparsity * size)
  each, extra = divmod(total, rows)
  if extra == 0:
    return each
  next_candidate = jnp.sort(scores, axis=1)[:, each]
  one_more = ranking.lowest_k_stable(next_candidate, extra)
  return (each + one_more.astype(jnp.int32))[:, None]


@functools.partial(jax.jit, static_argnames=('sparsity', 'nm', 'per_row'))
def magnitude(
  w: jax.Array, *, sparsity: float, nm: tuple[int, int] | None, per_row: bool
) -> jax.Array:
  """Keeps the largest |W|, over the whole layer or within each output row."""
  return _select(jnp.abs(w.astype(jnp.float32)), sparsity, nm, per_row)


@functools.partial(jax.jit, static_argnames=('sparsity', 'nm'))
def wanda(
  w: jax.Array, sqnorm: jax.Array, *, sparsity: float, nm: tuple[int, int] | None
) -> jax.Array:
  """Wanda (Sun et al. 2023, arXiv 2306.11695): keeps the largest |W_ij| * ||X_j||_2
  within each output row i, `X_j` the j-th input channel over all calibration tokens.

  `sqnorm` is `||X_j||^2` of shape (inputs,), or (outputs, inputs) where output rows read
  different inputs (the feature groups of a grouped convolution)."""
  scores = jnp.abs(w.astype(jnp.float32)) * jnp.sqrt(sqnorm)
  return _select(scores, sparsity, nm, per_row=True)


@functools.partial(jax.jit, static_argnames=('groups',))
def ria_scores(w: jax.Array, sqnorm: jax.Array, *, groups: int = 1) -> jax.Array:
  """RIA's relative importance and activations (Zhang et al., ICLR 2024, "Plug-and-Play"):
  `(|W_ij| / sum_k |W_ik| + |W_ij| / sum_k |W_kj|) * ||X_j||_2 ** 0.5`, the first sum over
  the row's inputs, the second over the outputs that read input j (those of its feature
  group for a grouped convolution); `sqnorm` as `wanda`'s. A zero sum gives a zero term."""
  a = jnp.abs(w.astype(jnp.float32))
  rows = jnp.sum(a, axis=1, keepdims=True)
  grouped = a.reshape(groups, -1, a.shape[1])
  cols = jnp.broadcast_to(jnp.sum(grouped, axis=1, keepdims=True), grouped.shape).reshape(a.shape)
  relative = jnp.where(rows > 0, a / jnp.where(rows > 0, rows, 1), 0) + jnp.where(
    cols > 0, a / jnp.where(cols > 0, cols, 1), 0
  )
  return relative * jnp.sqrt(jnp.sqrt(sqnorm))


@functools.partial(jax.jit, static_argnames=('sparsity', 'nm', 'per_row', 'groups'))
def ria(
  w: jax.Array,
  sqnorm: jax.Array,
  *,
  sparsity: float,
  nm: tuple[int, int] | None,
  per_row: bool,
  groups: int = 1,
) -> jax.Array:
  """RIA: keeps the largest `ria_scores` over the layer (its code's default) or within
  each output row (`per_row`), or N of every M inputs of each row."""
  return _select(ria_scores(w, sqnorm, groups=groups), sparsity, nm, per_row)


def inverse_hessian_factor(
  h: jax.Array, w: jax.Array, percdamp: float
) -> tuple[jax.Array, jax.Array]:
  """(upper Cholesky factor U of the dampened H^-1 with H^-1 = U^T U, W with dead inputs
  zeroed). A dead input (diag H = 0: never nonzero on the calibration data) gets H_jj = 1."""
  dead = jnp.diag(h) == 0
  h = h + jnp.diag(dead.astype(h.dtype))
  w = zeroed(~dead[None, :], w)
  h = h + percdamp * jnp.mean(jnp.diag(h)) * jnp.eye(h.shape[0], dtype=h.dtype)
  lower = jnp.linalg.cholesky(h)
  hinv = jax.scipy.linalg.cho_solve((lower, True), jnp.eye(h.shape[0], dtype=h.dtype))
  return jnp.linalg.cholesky(hinv).T, w


def _nm_block_step(w1, u1, prune1, i, nm):
  """At the first column of each group of m: prune the m - n of least w^2 / [H^-1]_jj^2."""
  n, m = nm
  group = jax.lax.dynamic_slice_in_dim(w1, i, m, axis=1)
  diag = jax.lax.dynamic_slice_in_dim(jnp.diag(u1), i, m)
  chosen = ranking.lowest_k_stable(group**2 / diag[None, :] ** 2, m - n, axis=1)
  updated = jax.lax.dynamic_update_slice_in_dim(prune1, chosen, i, axis=1)
  return jnp.where(i % m == 0, updated, prune1)


@functools.partial(jax.jit, static_argnames=('sparsity', 'nm', 'blocksize', 'percdamp'))
def sparsegpt(
  w: jax.Array,
  h: jax.Array,
  *,
  sparsity: float,
  nm: tuple[int, int] | None,
  blocksize: int,
  percdamp: float,
  count: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """SparseGPT (Frantar & Alistarh 2023, arXiv 2301.00774, Algorithm 1) on one layer.

  Columns (inputs) are visited left to right in blocks of `blocksize`. At the
  start of a block the mask of the block is chosen adaptively: the entries of
  least `w^2 / [U]_jj^2` (the OBS saliency) within the block, or per row and
  group of `m` columns for N:M, at the first column of the group. Each column's
  pruning error is spread over the remaining columns of the block at once (the
  OBS update, row i of U), and over the later blocks lazily, one matrix product
  per block.

  Args:
    w: float32 (outputs, inputs).
    h: float32 (inputs, inputs), the Hessian 2 X^T X / n of the layer's inputs.
    sparsity: the share pruned in each block, rounded so that the layer prunes
      `round(sparsity * w.size)` (ignored for N:M).
    nm: (n, m) to keep n of every m inputs per row, or None.
    blocksize: columns per block, a multiple of m for N:M.
    percdamp: dampening, as a share of the mean diagonal of H added to it.
    count: how many entries to prune in all, in place of `round(sparsity * w.size)`
      (an int32 scalar, traced: a feature group's share of its layer's target, see
      `group_counts`); the blocks share it in proportion to their columns.

  Returns:
    (the updated weights, zero where pruned; the mask; whether H^-1 was finite).
  """
  u, w = inverse_hessian_factor(h, w, percdamp)
  inputs = w.shape[1]
  masks = []
  for i1 in range(0, inputs, blocksize):
    i2 = min(i1 + blocksize, inputs)
    u1 = u[i1:i2, i1:i2]
    w1 = w[:, i1:i2]
    if nm is None:
      scores = w1**2 / jnp.diag(u1)[None, :] ** 2
      # Rounded as the blocks so far together, so the layer prunes round(s * size) in all.
      if count is None:
        block_count = round(sparsity * w.shape[0] * i2) - round(sparsity * w.shape[0] * i1)
      else:
        # round(count * i / inputs) in integers, the count traced.
        block_count = (2 * count * i2 + inputs) // (2 * inputs)
        block_count -= (2 * count * i1 + inputs) // (2 * inputs)
      prune1 = ranking.lowest_k_stable(scores, block_count)
    else:
      prune1 = jnp.zeros(w1.shape, bool)

    def column(i, carry, u1=u1):
      w1, q1, err1, prune1 = carry
      if nm is not None:
        prune1 = _nm_block_step(w1, u1, prune1, i, nm)
      col = jax.lax.dynamic_index_in_dim(w1, i, axis=1, keepdims=False)
      q = zeroed(~jax.lax.dynamic_index_in_dim(prune1, i, axis=1, keepdims=False), col)
      err = (col - q) / u1[i, i]
      w1 = w1 - err[:, None] * jax.lax.dynamic_index_in_dim(u1, i, axis=0)
      q1 = jax.lax.dynamic_update_index_in_dim(q1, q, i, axis=1)
      err1 = jax.lax.dynamic_update_index_in_dim(err1, err, i, axis=1)
      return w1, q1, err1, prune1

    zeros = jnp.zeros_like(w1)
    _, q1, err1, prune1 = jax.lax.fori_loop(0, i2 - i1, column, (w1, zeros, zeros, prune1))
    w = w.at[:, i1:i2].set(q1)
    w = w.at[:, i2:].add(-jnp.matmul(err1, u[i1:i2, i2:], precision=_HIGHEST))
    masks.append(~prune1)
  return w, jnp.concatenate(masks, axis=1), jnp.all(jnp.isfinite(u))


def group_counts(w: jax.Array, h: jax.Array, sparsity: float) -> jax.Array | None:
  """How many entries each feature group of a grouped layer prunes for SparseGPT, or None
  where each group's own `round(sparsity * size)` already adds up to the layer's. As
  `_row_counts`: `floor` of the layer's count per group, and one more in the groups whose
  next candidate has the least OBS saliency `w^2 [H]_jj` (a depthwise 3x3 convolution,
  a group of 9 inputs, would otherwise prune 4 of 9: 44.4% of a 50% target).

  Args:
    w: float32 (groups, outputs per group, inputs).
    h: float32 (groups, inputs, inputs), each group's Hessian.
    sparsity: the layer's target.

  Returns:
    int32 (groups,), or None.
  """
  groups = w.shape[0]
  total = round(sparsity * w.size)
  if total % groups == 0:
    return None
  saliency = w**2 * jnp.diagonal(h, axis1=1, axis2=2)[:, None, :]
  return jnp.reshape(_row_counts(saliency.reshape(groups, -1), sparsity), (groups,))


def relative_error(w: jax.Array, new: jax.Array, gram: jax.Array) -> jax.Array:
  """`||W X - W' X||^2 / ||W X||^2` summed over the rows of X, from the Gram matrix
  `X^T X`: `tr(D G D^T) / tr(W G W^T)`, D = W - W'. All three have a leading axis of
  feature groups, each with its own inputs; NaN when `W X` is zero."""

  def energy(m):
    return jnp.sum(jnp.matmul(m, gram, precision=_HIGHEST) * m)

  before = energy(w)
  return jnp.where(before > 0, energy(w - new) / before, jnp.nan)


def hessian(gram: jax.Array, rows: jax.Array) -> jax.Array:
  """H = 2 X^T X / n from the Gram matrix of n input rows."""
  return gram * (2.0 / rows)
