"""Rules for primitives that move positions: offsets, slices, lookups.

`concatenate`, `split`, `slice`, `pad`, `rev` and `tile` map positions with an
offset (a reversal, copies); `stack` and `unstack` add and remove an axis;
`gather`, `scatter-add` (its gradient), `dynamic_slice` and `dynamic_update_slice` pass
whole axes through and block the indexed ones, except a gather with a constant index,
which maps positions like `slice`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxprune.structured._core.shapes import var_shape as _shape


def concatenate(ctx, eqn) -> None:
  out = eqn.outvars[0]
  dim = eqn.params['dimension']
  out_ids = ctx.ids(out, dim)
  offset = 0
  for var in eqn.invars:
    shape = _shape(var)
    for axis in range(len(shape)):
      if axis != dim:
        ctx.join_axes(var, axis, out, axis)
    ids = ctx.ids(var, dim)
    if shape[dim] == 1 and out_ids is not None:
      ctx.block_ids(out_ids[offset : offset + 1], "size-1 piece of 'concatenate'")
    elif out_ids is not None:
      ctx.join(ids, out_ids[offset : offset + shape[dim]])
    offset += shape[dim]


def split(ctx, eqn) -> None:
  operand = eqn.invars[0]
  axis = eqn.params['axis']
  in_ids = ctx.ids(operand, axis)
  offset = 0
  for out in eqn.outvars:
    shape = _shape(out)
    for a in range(len(shape)):
      if a != axis:
        ctx.join_axes(operand, a, out, a)
    if in_ids is not None:
      piece = in_ids[offset : offset + shape[axis]]
      if shape[axis] == 1:
        ctx.block_ids(piece, "size-1 piece of 'split'")
      else:
        ctx.join(piece, ctx.ids(out, axis))
    offset += shape[axis]


def slice_(ctx, eqn) -> None:
  operand, out = eqn.invars[0], eqn.outvars[0]
  strides = eqn.params['strides'] or (1,) * len(_shape(operand))
  for axis, (start, limit, stride) in enumerate(
    zip(eqn.params['start_indices'], eqn.params['limit_indices'], strides, strict=True)
  ):
    ids = ctx.ids(operand, axis)
    if ids is None:
      continue
    picked = ids[start:limit:stride]
    if _shape(out)[axis] == 1:
      # A single picked position is a value the rest of the model relies on.
      ctx.block_ids(picked, "position picked by 'slice'")
    else:  # also strided: x[..., ::2] and x[..., 1::2] of interleaved rotary embeddings
      ctx.join(picked, ctx.ids(out, axis))


def pad(ctx, eqn) -> None:
  operand, out = eqn.invars[0], eqn.outvars[0]
  for axis, (low, _, interior) in enumerate(eqn.params['padding_config']):
    ids, out_ids = ctx.ids(operand, axis), ctx.ids(out, axis)
    if ids is None:
      continue
    if interior != 0 or out_ids is None:
      ctx.block(operand, axis)
      ctx.block(out, axis)
      continue
    positions = low + np.arange(len(ids))
    inside = (positions >= 0) & (positions < len(out_ids))
    ctx.join(ids[inside], out_ids[positions[inside]])
    if not inside.all():
      ctx.block_ids(ids[~inside], "position cut by negative 'pad'")


def rev(ctx, eqn) -> None:
  operand, out = eqn.invars[0], eqn.outvars[0]
  for axis in range(len(_shape(operand))):
    ids = ctx.ids(operand, axis)
    if ids is not None and axis in eqn.params['dimensions']:
      ctx.join(ids[::-1], ctx.ids(out, axis))
    else:
      ctx.join_axes(operand, axis, out, axis)


def static_gather(eqn, indices: np.ndarray | None) -> list[tuple[int, int, bool]] | None:
  """`(start, size, collapsed)` per operand axis when a gather is one static slice.

  `jnp` indexing turns `x[..., :4]` into a gather when a shape is symbolic
  (`jax.export`); with a constant index it is the same slice.
  """
  if indices is None:
    return None
  dnums, sizes = eqn.params['dimension_numbers'], eqn.params['slice_sizes']
  shape = _shape(eqn.invars[0])
  index_map = list(dnums.start_index_map)
  if (
    np.shape(indices) != (len(index_map),)
    or dnums.operand_batching_dims
    or not set(dnums.collapsed_slice_dims) <= set(index_map)
    or list(dnums.offset_dims) != list(range(len(shape) - len(dnums.collapsed_slice_dims)))
  ):
    return None
  slices = []
  for axis, (dim, size) in enumerate(zip(shape, sizes, strict=True)):
    start = int(indices[index_map.index(axis)]) if axis in index_map else 0
    if (
      axis in index_map
      and str(eqn.params['mode']).endswith('FILL_OR_DROP')
      and not (0 <= start <= dim - size)
    ):
      return None
    if axis in index_map:
      start = min(max(start, 0), dim - size)  # CLIP and PROMISE_IN_BOUNDS clamp
    slices.append((start, size, axis in dnums.collapsed_slice_dims))
  return slices


class Take(NamedTuple):
  """A gather that picks constant positions along one operand axis, every other axis
  whole: `jnp.take(x, positions, axis)` with the picked positions at output axis
  `out_axis`.

  `jnp` indexing writes a strided slice (`x[..., 1::2]` of interleaved rotary
  embeddings) or an index array so when a shape is symbolic (`jax.export`);
  at static shapes the same slice is a `slice`.
  """

  axis: int
  positions: np.ndarray
  out_axis: int


def constant_take(eqn, indices: np.ndarray | None) -> Take | None:
  """The `Take` a gather is, or None (not constant, or not of that form)."""
  if indices is None or np.ndim(indices) != 2 or np.shape(indices)[1] != 1:
    return None
  dnums, sizes = eqn.params['dimension_numbers'], eqn.params['slice_sizes']
  shape, out_rank = _shape(eqn.invars[0]), len(_shape(eqn.outvars[0]))
  (axis,) = dnums.start_index_map if len(dnums.start_index_map) == 1 else (None,)
  whole = [a for a in range(len(shape)) if a != axis]
  batch_out = [a for a in range(out_rank) if a not in dnums.offset_dims]
  if (
    axis is None
    or tuple(dnums.collapsed_slice_dims) != (axis,)
    or dnums.operand_batching_dims
    or sizes[axis] != 1
    or any(sizes[a] != shape[a] for a in whole)
    or len(batch_out) != 1
  ):
    return None
  positions = np.asarray(indices, np.int64)[:, 0]
  if str(eqn.params['mode']).endswith('FILL_OR_DROP'):
    if not ((positions >= 0) & (positions < shape[axis])).all():
      return None
  positions = np.clip(positions, 0, shape[axis] - 1)  # CLIP and PROMISE_IN_BOUNDS clamp
  return Take(axis, positions, batch_out[0])


def _take(ctx, eqn, take: Take) -> None:
  """Output position j is operand position `take.positions[j]` (a position picked
  twice is one channel, as `tile`'s copies are); unpicked positions are dropped."""
  operand, out = eqn.invars[0], eqn.outvars[0]
  ctx.note(take)
  offset_axes = [a for a in range(len(_shape(operand))) if a != take.axis]
  for axis, out_axis in zip(offset_axes, eqn.params['dimension_numbers'].offset_dims, strict=True):
    ctx.join_axes(operand, axis, out, out_axis)
  ids = ctx.ids(operand, take.axis)
  if ids is None:
    return
  if len(take.positions) == 1:
    ctx.block_ids(ids[take.positions], "position picked by 'gather'")
  else:
    ctx.join(ids[take.positions], ctx.ids(out, take.out_axis))


def gather(ctx, eqn) -> None:
  """Table lookups (embeddings): whole-slice axes pass through; indexed ones block.

  A gather that is one static slice (a constant index) maps positions like
  `slice`, and one that takes constant positions along one axis (`Take`) like a
  strided `slice`; `ctx.note` keeps either for the pruned callable.
  """
  operand, indices = eqn.invars[:2]
  out = eqn.outvars[0]
  index_value = ctx.value(indices)
  take = constant_take(eqn, index_value)
  if take is not None:
    _take(ctx, eqn, take)
    return
  slices = static_gather(eqn, index_value)
  if slices is not None:
    ctx.note(slices)
    out_axis = 0
    for axis, (start, size, collapsed) in enumerate(slices):
      ids = ctx.ids(operand, axis)
      if collapsed or (ids is not None and size == 1):
        ctx.block_ids(
          None if ids is None else ids[start : start + size], "position picked by 'gather'"
        )
      else:
        ctx.join(None if ids is None else ids[start : start + size], ctx.ids(out, out_axis))
      out_axis += not collapsed
    return
  dnums = eqn.params['dimension_numbers']
  slice_sizes = eqn.params['slice_sizes']
  out_rank = len(_shape(out))
  offset_dims = list(dnums.offset_dims)
  batch_out = [a for a in range(out_rank) if a not in offset_dims]
  skipped = set(dnums.collapsed_slice_dims) | set(dnums.operand_batching_dims)
  sliced = [a for a in range(len(_shape(operand))) if a not in skipped]
  # A slice as wide as its axis takes all of it whatever the start index (CLIP
  # and PROMISE_IN_BOUNDS clamp it to 0; FILL_OR_DROP fills the slice for any
  # other start, at every width): `w[i]` under `jax.vmap` indexes the
  # embedding axis too, at 0.
  full = lambda a: slice_sizes[a] == _shape(operand)[a]
  for axis, out_axis in zip(sliced, offset_dims, strict=True):
    if full(axis):
      ctx.join_axes(operand, axis, out, out_axis)
    else:
      ctx.block(operand, axis)
      ctx.block(out, out_axis)
  for axis in set(dnums.start_index_map) | set(dnums.collapsed_slice_dims):
    if axis in dnums.collapsed_slice_dims or not full(axis):
      ctx.block(operand, axis)
  # A batched lookup (a per-head table under vmap): operand batching axis i
  # and index batching axis i are one axis, so they go together.
  for axis, index_axis in zip(
    dnums.operand_batching_dims, dnums.start_indices_batching_dims, strict=True
  ):
    ctx.join_axes(operand, axis, indices, index_axis)
  _index_batch(ctx, indices, out, batch_out)


def scatter_add(ctx, eqn) -> None:
  """Updates added into the operand at indexed positions (the gradient of a `gather`, as
  `jax.grad` writes an embedding lookup's): gather's rule run backwards.

  The output is the operand with the sums in it, so each operand axis is the output's.
  An update window axis as wide as its operand axis adds into every position of it, so
  it joins them; a narrower window, an axis scattered into by the indices, and one the
  window leaves out block. The updates' scatter axes are the indices' batch axes.
  """
  operand, indices, updates = eqn.invars[:3]
  out = eqn.outvars[0]
  dnums = eqn.params['dimension_numbers']
  rank = len(_shape(operand))
  for axis in range(rank):
    ctx.join_axes(operand, axis, out, axis)
  left_out = set(dnums.inserted_window_dims) | set(dnums.operand_batching_dims)
  windowed = [a for a in range(rank) if a not in left_out]
  # The operand axes a window covers whole, each with its update axis.
  whole = {
    axis: update_axis
    for axis, update_axis in zip(windowed, dnums.update_window_dims, strict=True)
    if _shape(updates)[update_axis] == _shape(operand)[axis]
  }
  for axis, update_axis in zip(windowed, dnums.update_window_dims, strict=True):
    if axis in whole:
      ctx.join_axes(updates, update_axis, out, axis)
    else:
      ctx.block(out, axis)
      ctx.block(updates, update_axis)
  for axis in set(dnums.scatter_dims_to_operand_dims) | set(dnums.inserted_window_dims):
    if axis not in whole:
      ctx.block(out, axis)
  for axis, index_axis in zip(
    dnums.operand_batching_dims, dnums.scatter_indices_batching_dims, strict=True
  ):
    ctx.join_axes(out, axis, indices, index_axis)
  scatter_axes = [a for a in range(len(_shape(updates))) if a not in dnums.update_window_dims]
  _index_batch(ctx, indices, updates, scatter_axes)


def _index_batch(ctx, indices, other, other_axes: list[int]) -> None:
  """A gather's or scatter's indices: their batch axes (all but the last, the index
  vector) are `other`'s `other_axes`, in order; the index vector blocks, and so does every
  axis of indices laid out otherwise."""
  index_rank = len(_shape(indices))
  index_axes = [a for a in range(index_rank) if a != index_rank - 1]
  if len(index_axes) == len(other_axes):
    for axis, other_axis in zip(index_axes, other_axes, strict=True):
      ctx.join_axes(indices, axis, other, other_axis)
  else:
    for axis in range(index_rank):
      ctx.block(indices, axis)
  ctx.block(indices, index_rank - 1)


def dynamic_slice(ctx, eqn) -> None:
  operand, out = eqn.invars[0], eqn.outvars[0]
  for axis, size in enumerate(eqn.params['slice_sizes']):
    if size == _shape(operand)[axis]:
      ctx.join_axes(operand, axis, out, axis)
    else:
      ctx.block(operand, axis)
      ctx.block(out, axis)


def dynamic_update_slice(ctx, eqn) -> None:
  operand, update = eqn.invars[:2]
  out = eqn.outvars[0]
  for axis, size in enumerate(_shape(update)):
    ctx.join_axes(operand, axis, out, axis)
    if size == _shape(operand)[axis]:
      ctx.join_axes(update, axis, out, axis)
    else:
      ctx.block(operand, axis)
      ctx.block(update, axis)


def tile(ctx, eqn) -> None:
  """Every copy of a position is that position's channel."""
  operand, out = eqn.invars[0], eqn.outvars[0]
  for axis, reps in enumerate(eqn.params['reps']):
    ids, out_ids = ctx.ids(operand, axis), ctx.ids(out, axis)
    if ids is None:
      continue
    for rep in range(reps):
      ctx.join(ids, out_ids[rep * len(ids) : (rep + 1) * len(ids)])


def stack(ctx, eqn) -> None:
  """The new axis numbers the operands: it cannot lose a position; others join."""
  out, new_axis = eqn.outvars[0], eqn.params['axis']
  rank = len(_shape(out))
  for var in eqn.invars:
    for axis in range(rank - 1):
      ctx.join_axes(var, axis, out, axis + (axis >= new_axis))
  ctx.block_ids(ctx.ids(out, new_axis), "axis made by 'stack'")


def unstack(ctx, eqn) -> None:
  operand, old_axis = eqn.invars[0], eqn.params['axis']
  for out in eqn.outvars:
    for axis in range(len(_shape(out))):
      ctx.join_axes(operand, axis + (axis >= old_axis), out, axis)
  ctx.block_ids(ctx.ids(operand, old_axis), "axis split by 'unstack'")
