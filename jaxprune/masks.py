"""One variable's threshold and mask update (SPEC sections 4 and 5)."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from jaxprune import blocks, thresholds
from jaxprune.hparams import MAX_NBINS, POOLING, THRESHOLD_METHODS


def scores(weights: Array, block_dims: tuple[int, int] = (1, 1),
           block_pooling_function: str = 'AVG') -> Array:
  """The magnitudes the threshold is computed on: |w|, or its block-pooled 2-D form."""
  magnitudes = jnp.abs(jnp.asarray(weights, jnp.float32))
  resolved = blocks.resolve_block_dims(magnitudes.shape, block_dims)
  if resolved is None:
    return magnitudes
  squeezed = magnitudes.reshape([d for d in magnitudes.shape if d != 1])
  return blocks.pool(squeezed, resolved, block_pooling_function)


def expand_mask(score_mask: Array, shape: tuple[int, ...], block_dims: tuple[int, int]) -> Array:
  """Maps a mask over `scores(...)` back to a mask of the weights' `shape`."""
  resolved = blocks.resolve_block_dims(shape, block_dims)
  if resolved is None:
    return score_mask
  squeezed = tuple(d for d in shape if d != 1)
  return blocks.expand(score_mask, resolved, squeezed).reshape(shape)


def max_score(weights: Array, score: Array) -> Array:
  """max(score), read from the weights when the score is |weights|.

  max(max(w), -min(w)) reads `weights` twice but spares XLA a materialised
  |w| (a write and a read of the whole tensor) before its reduction.
  """
  if score.shape != weights.shape:
    return jnp.max(score)
  weights = jnp.asarray(weights, jnp.float32)
  return jnp.maximum(jnp.max(weights), -jnp.min(weights))


def threshold_of(parts: Sequence[Array], sparsity: Array, *, nbins: int,
                 threshold_method: str, value_max: Array | None = None) -> tuple[Array, Array]:
  """The current threshold of magnitude arrays `parts` and whether it is usable.

  Returns:
    (threshold, ok): ok is False when the maximum is zero (a zero-initialised
    layer) or not finite; the caller then keeps the previous mask (TF produced
    NaN thresholds or emptied the layer here).
  """
  if threshold_method not in THRESHOLD_METHODS:
    raise ValueError(
        f'threshold_method={threshold_method!r}: must be one of {THRESHOLD_METHODS}.')
  if value_max is None:
    value_max = thresholds.magnitude_max(parts)
  ok = jnp.isfinite(value_max) & (value_max > 0)
  # A safe max keeps the search finite when it is not used.
  safe_max = jnp.where(ok, value_max, jnp.float32(1.0))
  sparsity = jnp.asarray(sparsity, jnp.float32)
  if threshold_method == 'histogram':
    current = thresholds.histogram_threshold(parts, safe_max, sparsity, nbins)
  else:
    current = thresholds.exact_threshold(parts, safe_max, sparsity)
  return current, ok


def decay(current: Array, previous: Array, threshold_decay: float) -> Array:
  """thr = cur * (1 - decay) + old * decay (exponential smoothing between updates)."""
  if threshold_decay == 0.0:
    return current
  return current * jnp.float32(1.0 - threshold_decay) + previous * jnp.float32(threshold_decay)


def compare(magnitudes: Array, threshold: Array, threshold_method: str) -> Array:
  """`a > thr` for the histogram rule, `a >= thr` for the exact k-th value rule."""
  if threshold_method == 'exact':
    return magnitudes >= threshold
  return magnitudes > threshold


def finish_update(score: Array, current: Array, ok: Array, threshold: Array,
                  previous_mask: Array, shape: tuple[int, ...], block_dims: tuple[int, int],
                  threshold_decay: float, threshold_method: str) -> tuple[Array, Array]:
  """From a leaf's current threshold to its stored threshold and mask.

  Applies the decay, thresholds the scores, expands block masks to `shape`, and
  keeps `threshold` and `previous_mask` when `ok` is False.
  """
  new_threshold = decay(current, threshold, threshold_decay)
  mask = expand_mask(compare(score, new_threshold, threshold_method), shape, block_dims)
  return jnp.where(ok, new_threshold, threshold), jnp.where(ok, mask, previous_mask)


def update_mask(weights: Array, threshold: Array, sparsity: Array, *, nbins: int = 256,
                threshold_decay: float = 0.0, block_dims: tuple[int, int] = (1, 1),
                block_pooling_function: str = 'AVG', threshold_method: str = 'histogram',
                previous_mask: Array | None = None) -> tuple[Array, Array]:
  """Computes one variable's new threshold and mask (Zhu & Gupta 2017; TF model_pruning).

  Pure and jittable. All-zero or non-finite weights keep `threshold` and
  `previous_mask` (all True when not given).

  Args:
    weights: the variable, any shape.
    threshold: the stored threshold (float32 scalar), used by the decay.
    sparsity: the target fraction of zeros now, in [0, 1).
    nbins: histogram bins ('histogram' method).
    threshold_decay: exponential decay of the threshold, in [0, 1).
    block_dims: (height, width) of the blocks; -1 is the whole dimension.
    block_pooling_function: 'AVG' or 'MAX'.
    threshold_method: 'histogram' (TF's CDF rule) or 'exact' (k-th magnitude).
    previous_mask: the mask to keep when the weights cannot be thresholded.

  Returns:
    (new_threshold, mask) with mask a bool array of the weights' shape.
  """
  _check_arguments(sparsity, nbins, threshold_decay, block_dims, block_pooling_function,
                   threshold_method)
  weights = jnp.asarray(weights)
  score = scores(weights, block_dims, block_pooling_function)
  current, ok = threshold_of([score], sparsity, nbins=nbins, threshold_method=threshold_method,
                             value_max=max_score(weights, score))
  if previous_mask is None:
    previous_mask = jnp.ones(weights.shape, bool)
  return finish_update(score, current, ok, jnp.asarray(threshold, jnp.float32), previous_mask,
                       weights.shape, block_dims, threshold_decay, threshold_method)


def _check_arguments(sparsity, nbins, threshold_decay, block_dims, pooling, method) -> None:
  """ValueErrors naming the argument of `update_mask` that is out of its range."""
  def check(ok, what, rule):
    if not ok:
      raise ValueError(f'update_mask: {what}: {rule}.')

  check(method in THRESHOLD_METHODS, f'threshold_method={method!r}',
        f'must be one of {THRESHOLD_METHODS}')
  check(isinstance(pooling, str) and pooling.upper() in POOLING,
        f'block_pooling_function={pooling!r}', f'must be one of {POOLING}')
  check(isinstance(nbins, int) and 2 <= nbins <= MAX_NBINS, f'nbins={nbins!r}',
        'must be an integer in [2, 2**24]')
  check(0.0 <= threshold_decay < 1.0, f'threshold_decay={threshold_decay!r}', 'must be in [0, 1)')
  dims = tuple(block_dims)
  check(len(dims) == 2 and all(isinstance(d, int) and (d >= 1 or d == -1) for d in dims),
        f'block_dims={block_dims!r}', 'must be (height, width), each >= 1 or -1 (whole dim)')
  if not isinstance(sparsity, jax.core.Tracer):  # a traced sparsity cannot be checked here
    values = np.asarray(sparsity, np.float64)
    check(bool(np.all((values >= 0) & (values < 1))), f'sparsity={sparsity!r}',
          'must be in [0, 1)')
