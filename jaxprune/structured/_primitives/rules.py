"""One rule per primitive: how an equation ties the channels of its operands.

A rule is `rule(ctx, eqn) -> None`. It reads `eqn.invars`, `eqn.outvars` and
`eqn.params` and tells `ctx` which positions are the same channel:

  ctx.ids(var, axis)       int array of element ids of that axis, or None when
                           the axis is not tracked (a literal, or size 1)
  ctx.join(a, b)           positions a[i] and b[i] are one channel (arrays of
                           equal length, None is ignored)
  ctx.join_axes(v, i, w, j)  join axis i of v with axis j of w, elementwise
  ctx.block(var, axis)     this axis may not change size: its channels are
                           unprunable ("blocked by primitive '<name>'")
  ctx.block_ids(ids, reason) the same for some positions, with a reason
  ctx.fresh(n)             n new ids that belong to no tensor (factors)
  ctx.derive(ids, factors) position ids[p] is a merged position: it survives
                           only if factors[0][p], factors[1][p], ... survive
  ctx.walk(jaxpr, sub_index) -> scope; then
  ctx.ids(var, axis, scope) reaches the variables of that sub-jaxpr
  ctx.value(var)           the value of a constant operand, or None
  ctx.note(fact)           keep a fact for the shrink rule (`graph.notes`)
  ctx.norms                the `norms` option of `trace` (None, 'exact', 'renormalise')
  ctx.reduction(var, axis) the axis is summed over and stays prunable (`trace(norms=...)`)

Which primitive uses which rule is listed in `_primitives/table.py`, the one table.
A primitive with no rule blocks every tracked axis it touches: never guess.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from jaxprune.structured._core.products import conv_axes, dot_axes
from jaxprune.structured._core.shapes import var_shape

Rule = Callable[[Any, Any], None]


def elementwise(ctx, eqn) -> None:
  """Same-shape operands and results: join equal axes (numpy broadcasting)."""
  for out in eqn.outvars:
    out_shape = var_shape(out)
    for var in eqn.invars:
      shape = var_shape(var)
      lead = len(out_shape) - len(shape)
      for axis, size in enumerate(shape):
        if size == out_shape[lead + axis]:
          ctx.join_axes(var, axis, out, lead + axis)
        elif size != 1:
          ctx.block(var, axis)


def bitcast(ctx, eqn) -> None:
  """Same bit width: elementwise; otherwise an axis is split into bytes, so block."""
  if var_shape(eqn.invars[0]) == var_shape(eqn.outvars[0]):
    elementwise(ctx, eqn)
  else:
    block_all(ctx, eqn)


def fresh_outputs(ctx, eqn) -> None:
  """Outputs made from no channel (random bits, keys): only inputs may block."""
  for var in eqn.invars:
    for axis in range(len(var_shape(var))):
      ctx.block(var, axis)


def no_values(ctx, eqn) -> None:
  """Debug printing: produces no value the model computes with."""
  del ctx, eqn


def broadcast_in_dim(ctx, eqn) -> None:
  operand, out = eqn.invars[0], eqn.outvars[0]
  for axis, out_axis in enumerate(eqn.params['broadcast_dimensions']):
    ctx.join_axes(operand, axis, out, out_axis)


def transpose(ctx, eqn) -> None:
  for out_axis, axis in enumerate(eqn.params['permutation']):
    ctx.join_axes(eqn.invars[0], axis, eqn.outvars[0], out_axis)


def squeeze(ctx, eqn) -> None:
  operand = eqn.invars[0]
  rank = len(var_shape(operand))
  dropped = {d % rank for d in eqn.params['dimensions']}
  kept = [a for a in range(rank) if a not in dropped]
  for out_axis, axis in enumerate(kept):
    ctx.join_axes(operand, axis, eqn.outvars[0], out_axis)


def reduce(ctx, eqn) -> None:
  operand = eqn.invars[0]
  axes = set(eqn.params['axes'])
  kept = [a for a in range(len(var_shape(operand))) if a not in axes]
  for out in eqn.outvars:
    for out_axis, axis in enumerate(kept):
      ctx.join_axes(operand, axis, out, out_axis)
  # A sum or max over channels changes when a channel goes (a norm's mean);
  # no consumer weight absorbs that, so the channels are not prunable, unless
  # `trace(norms=...)` lets sums through (norms.py says when that is exact).
  for axis in axes:
    if eqn.primitive.name == 'reduce_sum' and ctx.norms is not None:
      ctx.reduction(operand, axis)
    else:
      ctx.block_ids(ctx.ids(operand, axis), f"reduced over by '{eqn.primitive.name}'")


def collective(ctx, eqn) -> None:
  """`psum` / `pmax` / `pmin`: integer axes (what `vmap` with an `axis_name`
  leaves) reduce like `reduce_sum`; device (named) axes keep every local axis,
  channel c of each device meeting channel c of the others."""
  positional = {a for a in eqn.params['axes'] if isinstance(a, (int, np.integer))}
  for var, out in zip(eqn.invars, eqn.outvars, strict=True):
    kept = [a for a in range(len(var_shape(var))) if a not in positional]
    for out_axis, axis in enumerate(kept):
      ctx.join_axes(var, axis, out, out_axis)
    for axis in positional:
      ctx.block_ids(ctx.ids(var, axis), f"reduced over by '{eqn.primitive.name}'")


def _mixed_radix(sizes: list[int]) -> list[np.ndarray]:
  """Digit arrays of positions 0..prod(sizes)-1 in row-major order."""
  positions = np.arange(int(np.prod(sizes)))
  digits, stride = [], int(np.prod(sizes))
  for size in sizes:
    stride //= size
    digits.append((positions // stride) % size)
  return digits


def _merge(
  ctx, merged: np.ndarray | None, factors: list[np.ndarray | None], sizes: list[int]
) -> None:
  """`merged` (row-major flatten of `factors`) is derived from them."""
  if merged is None:
    # Merged into an untracked (symbolic) axis: the factors cannot be followed.
    for ids in factors:
      ctx.block_ids(ids, 'reshaped with a symbolic dimension')
    return
  digits = _mixed_radix(sizes)
  factor_ids = []
  for ids, digit, size in zip(factors, digits, sizes, strict=True):
    factor_ids.append((ids if ids is not None else ctx.fresh(size))[digit])
  ctx.derive(merged, factor_ids)


def reshape(ctx, eqn) -> None:
  operand, out = eqn.invars[0], eqn.outvars[0]
  in_shape, out_shape = var_shape(operand), var_shape(out)
  if eqn.params.get('dimensions') is not None:
    block_all(ctx, eqn)
    return
  in_dims = [a for a, n in enumerate(in_shape) if n != 1]
  out_dims = [a for a, n in enumerate(out_shape) if n != 1]
  i = j = 0
  while i < len(in_dims) or j < len(out_dims):
    ins, outs = [in_dims[i]], [out_dims[j]]
    i, j = i + 1, j + 1
    p_in, p_out = in_shape[ins[0]], out_shape[outs[0]]
    while p_in != p_out:
      if p_in < p_out:
        ins.append(in_dims[i])
        p_in *= in_shape[in_dims[i]]
        i += 1
      else:
        outs.append(out_dims[j])
        p_out *= out_shape[out_dims[j]]
        j += 1
    if len(ins) == 1 and len(outs) == 1:
      ctx.join_axes(operand, ins[0], out, outs[0])
    elif len(outs) == 1:
      _merge(
        ctx, ctx.ids(out, outs[0]), [ctx.ids(operand, a) for a in ins], [in_shape[a] for a in ins]
      )
    elif len(ins) == 1:
      _merge(
        ctx, ctx.ids(operand, ins[0]), [ctx.ids(out, a) for a in outs], [out_shape[a] for a in outs]
      )
    else:
      reason = f'reshape mixes axes {[in_shape[a] for a in ins]} -> {[out_shape[a] for a in outs]}'
      for a in ins:
        ctx.block_ids(ctx.ids(operand, a), reason)
      for a in outs:
        ctx.block_ids(ctx.ids(out, a), reason)


def dot_general(ctx, eqn) -> None:
  lhs, rhs = eqn.invars[:2]
  out = eqn.outvars[0]
  (lc, rc), (lb, rb) = dot_axes(eqn)
  for a, b in zip(lc, rc, strict=True):
    ctx.join_axes(lhs, a, rhs, b)
  out_axis = 0
  for a, b in zip(lb, rb, strict=True):
    ctx.join_axes(lhs, a, rhs, b)
    ctx.join_axes(lhs, a, out, out_axis)
    out_axis += 1
  for var, used in ((lhs, set(lc) | set(lb)), (rhs, set(rc) | set(rb))):
    for a in range(len(var_shape(var))):
      if a not in used:
        ctx.join_axes(var, a, out, out_axis)
        out_axis += 1


def conv(ctx, eqn) -> None:
  lhs, rhs = eqn.invars[:2]
  out = eqn.outvars[0]
  axes = conv_axes(eqn)
  if eqn.params['batch_group_count'] != 1:
    block_all(ctx, eqn)
    return
  ctx.join_axes(lhs, axes.lhs_batch, out, axes.out_batch)
  reason = "spatial axis of 'conv_general_dilated'"
  for var, spatial in ((lhs, axes.lhs_spatial), (rhs, axes.rhs_spatial), (out, axes.out_spatial)):
    for axis in spatial:
      ctx.block_ids(ctx.ids(var, axis), reason)
  groups = eqn.params['feature_group_count']
  ctx.join_axes(rhs, axes.rhs_out, out, axes.out_feature)
  if groups == 1:
    ctx.join_axes(lhs, axes.lhs_feature, rhs, axes.rhs_in)
    return
  # Grouped conv: input channel g*Ki + j uses kernel in-feature j, output
  # channel g*Mg + m belongs to group g. Keeping the grouped structure means a
  # channel (g, j) goes only with all of group g or with j in every group.
  group_ids = ctx.fresh(groups)
  per_in = var_shape(rhs)[axes.rhs_in]
  per_out = var_shape(rhs)[axes.rhs_out] // groups
  for ids, size, inner in (
    (ctx.ids(lhs, axes.lhs_feature), per_in, ctx.ids(rhs, axes.rhs_in)),
    (ctx.ids(rhs, axes.rhs_out), per_out, None),
  ):
    if size == 1:
      ctx.join(ids, group_ids)
    else:
      _merge(ctx, ids, [group_ids, inner], [groups, size])


def along_axis(param: str) -> Rule:
  """Ops that mix positions along one axis (cumsum, sort): block it, join the rest."""

  def rule(ctx, eqn) -> None:
    shape = var_shape(eqn.invars[0])
    axis = eqn.params[param] % len(shape)
    for out in eqn.outvars:
      for var in eqn.invars:
        for a in range(len(shape)):
          if a != axis:
            ctx.join_axes(var, a, out, a)
    for var in (*eqn.invars, *eqn.outvars):
      ctx.block(var, axis)

  return rule


def reduce_window(ctx, eqn) -> None:
  params = eqn.params
  rank = len(var_shape(eqn.invars[0]))
  base = params.get('base_dilation') or (1,) * rank
  window_dilation = params.get('window_dilation') or (1,) * rank
  operands = eqn.invars[: len(eqn.outvars)]
  for axis in range(rank):
    plain = (
      params['window_dimensions'][axis] == 1
      and params['window_strides'][axis] == 1
      and tuple(params['padding'][axis]) == (0, 0)
      and base[axis] == 1
      and window_dilation[axis] == 1
    )
    for var, out in zip(operands, eqn.outvars, strict=True):
      if plain:
        ctx.join_axes(var, axis, out, axis)
      else:
        reason = f"window axis of '{eqn.primitive.name}'"
        ctx.block_ids(ctx.ids(var, axis), reason)
        ctx.block_ids(ctx.ids(out, axis), reason)


def identity_pairs(ctx, eqn) -> None:
  for var, out in zip(eqn.invars, eqn.outvars, strict=True):
    for axis in range(len(var_shape(var))):
      ctx.join_axes(var, axis, out, axis)


def block_all(ctx, eqn) -> None:
  """The rule of a primitive with no rule: every tracked axis it touches blocks."""
  for var in (*eqn.invars, *eqn.outvars):
    for axis in range(len(var_shape(var))):
      ctx.block(var, axis)
