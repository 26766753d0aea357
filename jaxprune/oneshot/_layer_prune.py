"""One layer's pruning: its weight as a matrix (outputs, inputs), the method's mask and
new weights, put back into its leaf (or a stack's slice of it)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxprune._transform.updates import zeroed
from jaxprune.oneshot import _dsnot
from jaxprune.oneshot import _inputs as inputs
from jaxprune.oneshot import _solvers as solvers
from jaxprune.oneshot._layers import Layer

Target = inputs.Target


def _matrix(leaf: jax.Array, in_axes: tuple[int, ...]) -> jax.Array:
  """The leaf as float32 (outputs, inputs): other axes first, then `in_axes` in order."""
  out_axes = tuple(a for a in range(leaf.ndim) if a not in in_axes)
  moved = jnp.transpose(leaf, out_axes + in_axes).astype(jnp.float32)
  inputs = int(np.prod([leaf.shape[a] for a in in_axes]))
  return moved.reshape(-1, inputs)


def _unmatrix(matrix: jax.Array, like: jax.Array, in_axes: tuple[int, ...]) -> jax.Array:
  out_axes = tuple(a for a in range(like.ndim) if a not in in_axes)
  perm = out_axes + in_axes
  moved = matrix.reshape([like.shape[a] for a in perm])
  return jnp.transpose(moved, np.argsort(perm))


def _slice_axes(layer: Layer) -> tuple[int, ...]:
  """The layer's input axes in its weight: the leaf, or a stack's slice of it."""
  if layer.stack is None:
    return layer.in_axes
  return tuple(a - (a > layer.stack.axis) for a in layer.in_axes)


def weight(layer: Layer, leaf: jax.Array) -> jax.Array:
  """The layer's weight: the leaf, or its slice for a stacked layer."""
  if layer.stack is None:
    return leaf
  return jax.lax.index_in_dim(leaf, layer.stack.index, layer.stack.axis, keepdims=False)


def weight_matrix(layer: Layer, leaf: jax.Array) -> jax.Array:
  """The layer's weight (the leaf, or its slice) as float32 (outputs, inputs)."""
  return _matrix(weight(layer, leaf), _slice_axes(layer))


def put(
  layer: Layer, leaf: jax.Array, mask: Any, new: jax.Array, new_mask: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """(leaf, mask) with the layer's weight and mask replaced (a stack's other slices kept,
  those not pruned with a mask of all True)."""
  if layer.stack is None:
    return new, new_mask
  if mask is None:
    mask = jnp.ones(leaf.shape, bool)
  index, axis = layer.stack.index, layer.stack.axis
  return (
    jax.lax.dynamic_update_index_in_dim(leaf, new, index, axis),
    jax.lax.dynamic_update_index_in_dim(mask, new_mask, index, axis),
  )


def matrix_shape(layer: Layer, leaf: Any) -> tuple[int, int]:
  """(outputs, inputs) of the layer's weight as a matrix."""
  inputs = int(np.prod([leaf.shape[a] for a in layer.in_axes]))
  stacked = leaf.shape[layer.stack.axis] if layer.stack is not None else 1
  return int(np.prod(leaf.shape)) // inputs // stacked, inputs


@functools.partial(
  jax.jit,
  static_argnames=(
    'in_axes',
    'groups',
    'target',
    'method',
    'per_row',
    'blocksize',
    'percdamp',
    'with_error',
    'dsnot',
  ),
)
def _prune_leaf(
  leaf: jax.Array,
  stat: Any,
  rows: Any,
  *,
  in_axes: tuple[int, ...],
  groups: int,
  target: Target,
  method: str,
  per_row: bool,
  blocksize: int,
  percdamp: float,
  with_error: bool,
  dsnot: _dsnot.DSnoT | None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """(new weight, mask, whether SparseGPT's H^-1 was finite, relative reconstruction
  error (`with_error`, from the Gram matrix in `stat`; NaN otherwise)) of one layer's
  weight, fixed up by DSnoT's swaps where `dsnot` is given."""
  sparsity, nm = target
  w = _matrix(leaf, in_axes)
  finite = jnp.bool_(True)

  def per_row_stat(kind):  # (groups, inputs) -> (outputs, inputs)
    return jnp.repeat(stat[kind], w.shape[0] // groups, axis=0)

  if method == 'magnitude':
    mask = solvers.magnitude(w, sparsity=sparsity, nm=nm, per_row=per_row)
    new = zeroed(mask, w)
  elif method == 'wanda':
    mask = solvers.wanda(w, per_row_stat('sqnorm'), sparsity=sparsity, nm=nm)
    new = zeroed(mask, w)
  elif method == 'ria':
    mask = solvers.ria(
      w, per_row_stat('sqnorm'), sparsity=sparsity, nm=nm, per_row=per_row, groups=groups
    )
    new = zeroed(mask, w)
  else:
    grouped = w.reshape(groups, -1, w.shape[1])
    solve = functools.partial(
      solvers.sparsegpt,
      sparsity=sparsity,
      nm=nm,
      blocksize=min(blocksize, w.shape[1]),
      percdamp=percdamp,
    )
    h = solvers.hessian(stat['gram'], rows)
    if groups == 1:
      new, mask, finite = solve(grouped[0], h[0])
    else:
      # Each group's share of the layer's target, where rounding each alone falls short.
      counts = None if nm is not None else solvers.group_counts(grouped, h, sparsity)
      if counts is None:
        new, mask, finite = jax.vmap(solve)(grouped, h)
      else:
        new, mask, finite = jax.vmap(lambda w, h, c: solve(w, h, count=c))(grouped, h, counts)
      new, mask, finite = new.reshape(w.shape), mask.reshape(w.shape), jnp.all(finite)
  if dsnot is not None:
    mean = per_row_stat('sum') / rows
    var = per_row_stat('sqnorm') / rows - mean**2
    new, mask = _dsnot.fix_up(
      w,
      new,
      mask,
      mean,
      var,
      jnp.sqrt(per_row_stat('sqnorm')),
      stat['gram'],
      nm=nm,
      config=dsnot,
    )
  error = jnp.float32(jnp.nan)
  if with_error:
    error = solvers.relative_error(
      w.reshape(groups, -1, w.shape[1]), new.reshape(groups, -1, w.shape[1]), stat['gram']
    )
  return (
    _unmatrix(new, leaf, in_axes).astype(leaf.dtype),
    _unmatrix(mask, leaf, in_axes),
    finite,
    error,
  )


def prune_layer(
  layer: Layer,
  weight: jax.Array,
  stat: Any,
  target: Target,
  method: str,
  *,
  per_row: bool,
  blocksize: int,
  percdamp: float,
  with_error: bool,
  dsnot: _dsnot.DSnoT | None = None,
) -> tuple[jax.Array, jax.Array, float]:
  """(new weight, mask, relative error or NaN) of one layer; a ValueError for a singular
  Hessian."""
  value, rows = stat if stat is not None else (None, 1)
  new, mask, finite, error = _prune_leaf(
    weight,
    value,
    jnp.float32(rows),
    in_axes=_slice_axes(layer),
    groups=layer.groups,
    target=target,
    method=method,
    per_row=per_row,
    blocksize=blocksize,
    percdamp=percdamp,
    with_error=with_error,
    dsnot=dsnot,
  )
  if not bool(finite):
    raise ValueError(
      f'sparsegpt: the Hessian of the inputs of layer {layer.name!r} is '
      f'singular (percdamp={percdamp}); set percdamp > 0, e.g. 0.01, or '
      'calibrate on more tokens.'
    )
  return new, mask, float(error)
