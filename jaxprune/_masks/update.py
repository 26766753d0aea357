"""Thresholds and masks of pruned variables.

See docs/explanation/semantics.md#histogram-thresholds and #blocks.

`update_mask` is one variable's update; `update_masks` is the same rule for
many variables (or stacked layers) at once, searched together (see
`thresholds`), which is what the optax transform runs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array

from jaxprune._checks import check_fraction
from jaxprune._config import hparams as hparams_lib
from jaxprune._config.specs import resolve_block_dims
from jaxprune._masks import blocks as blocks
from jaxprune._search import counting as counting
from jaxprune._search import subnormal as subnormal
from jaxprune._search import thresholds as thresholds


def _pool_layers(
  magnitudes: Array, layer_axes: int, block_dims: tuple[int, int], pooling: str
) -> Array:
  """Block-pools each layer's squeezed 2-D magnitudes; (layers..., rows, cols)."""
  lead = magnitudes.shape[:layer_axes]
  squeezed = [d for d in magnitudes.shape[layer_axes:] if d != 1]
  flat = magnitudes.reshape(-1, *squeezed)
  pooled = jax.vmap(lambda m: blocks.pool(m, block_dims, pooling))(flat)
  return pooled.reshape(*lead, *pooled.shape[1:])


def scores(
  weights: Array,
  block_dims: tuple[int, int] = (1, 1),
  block_pooling_function: str = 'AVG',
  layer_axes: int = 0,
) -> Array:
  """The magnitudes thresholds are computed on: |w| in float32, or its block-pooled form.

  `block_dims` are resolved (`resolve_block_dims`; (1, 1) for elementwise). With
  `layer_axes` > 0 the leading axes index stacked layers, each pooled on its own.
  """
  magnitudes = jnp.abs(jnp.asarray(weights).astype(jnp.float32))
  if tuple(block_dims) == (1, 1):
    return magnitudes
  return _pool_layers(magnitudes, layer_axes, block_dims, block_pooling_function)


def expand_mask(
  score_mask: Array, shape: tuple[int, ...], block_dims: tuple[int, int], layer_axes: int = 0
) -> Array:
  """Maps a mask over `scores(...)` back to a mask of the weights' `shape` (`block_dims`
  resolved, as there)."""
  if tuple(block_dims) == (1, 1):
    return score_mask
  squeezed = tuple(d for d in shape[layer_axes:] if d != 1)
  flat = score_mask.reshape(-1, *score_mask.shape[layer_axes:])
  expanded = jax.vmap(lambda m: blocks.expand(m, block_dims, squeezed))(flat)
  return expanded.reshape(shape)


def compare(magnitudes: Array, threshold: Array, threshold_method: str) -> Array:
  """`a > thr` for the histogram rule, `a >= thr` for the exact k-th value rule."""
  if threshold_method == 'exact':
    return magnitudes >= threshold
  return magnitudes > threshold


@dataclasses.dataclass(frozen=True)
class Variable:
  """One pruned variable of a mask update.

  Attributes:
    values: `pass_value -> array` of the weights to threshold (any float dtype),
      a `counting.WeightReader`; called wherever the weights are read, so that XLA
      recomputes rather than stores them.
    shape: their shape.
    block_dims: (height, width), resolved once, where the variable's spec is made
      (`resolve_block_dims`); (1, 1) for elementwise masks.
    layer_axes: leading axes that index stacked layers, each with its own threshold.
  """

  values: Callable[[Any], Array]
  shape: tuple[int, ...]
  block_dims: tuple[int, int] = (1, 1)
  layer_axes: int = 0

  @property
  def num_layers(self) -> int:
    return math.prod(self.shape[: self.layer_axes])

  def is_blocked(self) -> bool:
    return tuple(self.block_dims) != (1, 1)


def update_masks(
  variables: Sequence[Variable],
  sparsity: Sequence[Array],
  old_thresholds: Sequence[Array],
  old_masks: Sequence[Array],
  *,
  nbins: int,
  threshold_decay: float,
  threshold_method: str,
  pooling: str,
  global_threshold: bool = False,
  mask_search: str,
) -> tuple[list[Array], list[Array], Array]:
  """New thresholds and masks of many variables, searched together.

  Units are the thresholds: one per layer of each variable, or one for all of
  them when `global_threshold`. A unit whose maximum is zero or not finite
  keeps its old threshold and mask (TF produced NaN thresholds or emptied the
  layer there).

  Args:
    variables: the pruned variables.
    sparsity: per variable (one for all when `global_threshold`), the (layers,)
      float32 targets.
    old_thresholds: the same shapes: the stored thresholds, used by the decay.
    old_masks: bool masks of the variables' shapes.
    nbins, threshold_decay, threshold_method, pooling: the hparams of
      docs/explanation/semantics.md#histogram-thresholds and #blocks.
    global_threshold: one threshold over all variables.
    mask_search: the search, 'auto', 'fixed' or 'adaptive' (the hparam of that
      name); the same result either way.

  Returns:
    (thresholds like `old_thresholds`, masks, a bool per layer of each variable:
    True where the weights hold a NaN or Inf).
  """
  search = thresholds.resolve_search(mask_search)
  layout = counting.Layout(
    tuple(_own_part(v, pooling, global_threshold) for v in variables), shared=global_threshold
  )
  # Each variable's maxima per layer (Inf where a NaN is). The per-unit arithmetic below
  # runs on all units at once, and each part selects its own threshold; whether its units
  # are thresholded it reads off its own maxima.
  part_maxima = counting.part_maxima(
    dataclasses.replace(
      layout,
      parts=tuple(
        dataclasses.replace(part, unit_axes=v.layer_axes)
        for part, v in zip(layout.parts, variables, strict=True)
      ),
      shared=False,
    )
  )
  maxima = counting.joined_maxima(part_maxima)
  unit_max = jnp.max(maxima, keepdims=True) if global_threshold else maxima
  ok = _usable(unit_max)
  # A safe max keeps the searches finite where they are not used.
  safe_max = jnp.where(ok, unit_max, jnp.float32(1.0))
  if global_threshold:
    sparsity = jnp.reshape(sparsity[0], (-1,))
    previous = jnp.reshape(old_thresholds[0], (-1,))
  else:
    sparsity = jnp.concatenate([jnp.reshape(s, (-1,)) for s in sparsity])
    previous = jnp.concatenate([jnp.reshape(t, (-1,)) for t in old_thresholds])
  if threshold_method == 'histogram':
    current = thresholds.histogram_thresholds(layout, safe_max, sparsity, nbins, search)
  else:
    current = thresholds.exact_thresholds(layout, safe_max, sparsity, search)
  if threshold_decay:
    # The select (thresholds are >= 0) keeps the threshold's product rounded: XLA:CPU
    # would otherwise fuse it into the decay's multiply-add.
    current = jnp.where(current >= 0, current, jnp.float32(0.0))
    current = current * jnp.float32(1.0 - threshold_decay) + previous * jnp.float32(threshold_decay)
  new = jnp.where(ok, current, previous)
  # Where a unit is thresholded its new threshold is the one searched, and its mask
  # compares with it; elsewhere the old mask stays.
  pieces = layout.pieces(new)
  if global_threshold:
    goods = [ok] * len(variables)
  else:
    goods = [jnp.isfinite(sums) & _usable(m) for sums, m in part_maxima]
  masks = [
    _new_mask(part.values(piece), piece, good, old_mask, _static(variable), threshold_method)
    for part, variable, old_mask, piece, good in zip(
      layout.parts, variables, old_masks, pieces, goods, strict=True
    )
  ]
  new_thresholds = [new] if global_threshold else pieces
  nonfinite = ~jnp.isfinite(maxima)
  return new_thresholds, masks, nonfinite


def _usable(maxima: Array) -> Array:
  """Whether units with these maxima are thresholded (finite and not all zero)."""
  return jnp.isfinite(maxima) & (maxima > 0)


def _static(variable: Variable) -> Variable:
  """The variable without its values: what `_new_mask` is traced for (hashable)."""
  return dataclasses.replace(variable, values=None, block_dims=tuple(variable.block_dims))


@functools.partial(jax.jit, static_argnums=(4, 5))
def _new_mask(
  values: Array,
  threshold: Array,
  ok: Array,
  old_mask: Array,
  variable: Variable,
  threshold_method: str,
) -> Array:
  """A variable's mask from its values (scores) and its units' thresholds, or its old mask
  where `ok` is False (traced once per shape)."""
  score_mask = compare(values, _layer_shaped(variable, threshold, values.ndim), threshold_method)
  mask = expand_mask(score_mask, variable.shape, variable.block_dims, variable.layer_axes)
  return jnp.where(_layer_shaped(variable, ok, len(variable.shape)), mask, old_mask)


def _own_part(variable: Variable, pooling: str, global_threshold: bool) -> counting.Part:
  """The magnitudes a variable's threshold is searched on (|w|, or its pooled blocks)."""
  if variable.is_blocked():
    pooled = scores(variable.values(None), variable.block_dims, pooling, variable.layer_axes)
    return counting.Part(
      counting.WeightReader.of(pooled),
      pooled.shape,
      0 if global_threshold else variable.layer_axes,
    )
  return counting.Part(
    lambda pass_value: jnp.abs(variable.values(pass_value).astype(jnp.float32)),
    variable.shape,
    0 if global_threshold else variable.layer_axes,
    signed=variable.values,
  )


def _layer_shaped(variable: Variable, per_layer: Array, ndim: int) -> Array:
  """A (layers,) or (1,) array shaped to broadcast against an ndim array of the variable."""
  if per_layer.shape[0] != variable.num_layers:  # one threshold for all (global)
    return per_layer.reshape((1,) * ndim)
  lead = variable.shape[: variable.layer_axes]
  return per_layer.reshape(lead + (1,) * (ndim - len(lead)))


def update_mask(
  weights: Array,
  threshold: Array,
  sparsity: Array,
  *,
  nbins: int = hparams_lib.HParams.nbins,
  threshold_decay: float = hparams_lib.HParams.threshold_decay,
  block_dims: tuple[int, int] = (1, 1),
  block_pooling_function: str = hparams_lib.HParams.block_pooling_function,
  threshold_method: str = hparams_lib.HParams.threshold_method,
  previous_mask: Array | None = None,
  mask_search: str = hparams_lib.HParams.mask_search,
) -> tuple[Array, Array]:
  """Computes one variable's new threshold and mask (Zhu & Gupta 2017; TF model_pruning).

  Pure and jittable. Empty, all-zero or non-finite weights keep `threshold` and
  `previous_mask` (all True when not given).

  The keyword arguments are the hparams of the same names, with their defaults
  (`HParams`'); `block_dims` is (block_height, block_width).

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
    mask_search: how the threshold is searched, with the same result: 'fixed'
      (a few passes, no control flow per variable: GPUs, TPUs), 'adaptive'
      (CPUs), or 'auto' (by `jax.default_backend()`).

  Returns:
    (new_threshold, mask) with mask a bool array of the weights' shape.

  Example:
    >>> import jax, jax.numpy as jnp, numpy as np, jaxprune
    >>> w = jnp.asarray(np.linspace(1, 100, 100), jnp.float32)
    >>> threshold, mask = jax.jit(jaxprune.update_mask)(w, 0.0, 0.9)
    >>> float(threshold), int(mask.sum())  # TF's numbers: the histogram keeps 11
    (89.84375, 11)
  """
  _check_arguments(
    sparsity,
    nbins,
    threshold_decay,
    block_dims,
    block_pooling_function,
    threshold_method,
    mask_search,
  )
  subnormal.warn_subnormal([('weights', weights, 0)], 'update_mask')
  weights = jnp.asarray(weights)
  if previous_mask is None:
    previous_mask = jnp.ones(weights.shape, bool)
  if weights.size == 0:  # nothing to threshold: kept as it is, as in training
    return jnp.asarray(threshold, jnp.float32).reshape(()), previous_mask
  dims = resolve_block_dims(weights.shape, block_dims) or (1, 1)
  variable = Variable(counting.WeightReader.of(weights), weights.shape, dims)
  (new_threshold,), (mask,), _ = update_masks(
    [variable],
    [jnp.reshape(jnp.asarray(sparsity, jnp.float32), (1,))],
    [jnp.reshape(jnp.asarray(threshold, jnp.float32), (1,))],
    [previous_mask],
    nbins=nbins,
    threshold_decay=threshold_decay,
    threshold_method=threshold_method,
    pooling=block_pooling_function,
    mask_search=mask_search,
  )
  return new_threshold[0], mask


def _check_arguments(
  sparsity, nbins, threshold_decay, block_dims, pooling, method, mask_search
) -> None:
  """ValueErrors naming the argument of `update_mask` that is out of its range (the
  hparams' own rules, `hparams.check_value`)."""
  for field, value in (
    ('threshold_method', method),
    ('block_pooling_function', pooling),
    ('nbins', nbins),
    ('threshold_decay', threshold_decay),
    ('mask_search', mask_search),
  ):
    hparams_lib.check_value(field, value, where='update_mask')
  dims = tuple(block_dims)
  if len(dims) != 2:
    raise ValueError(
      f'update_mask: block_dims={block_dims!r}: must be (height, width), each '
      '>= 1 or -1 (whole dim).'
    )
  for field, value in zip(('block_height', 'block_width'), dims, strict=True):
    hparams_lib.check_value(field, value, where=f'update_mask: block_dims={block_dims!r}')
  if not isinstance(sparsity, jax.core.Tracer):  # a traced sparsity cannot be checked here
    check_fraction('sparsity', sparsity, where='update_mask')
