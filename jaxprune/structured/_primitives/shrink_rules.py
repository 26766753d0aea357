"""How primitives run at pruned shapes: the `shrink` column of the primitives table.

A shrink rule is `rule(shrinker, eqn, scope, eqn_index, invals) -> outputs`;
`invals` already have their pruned shapes and the outputs must have
`shrinker.shape(scope, outvar)`. Primitives whose parameters hold no shapes
need no rule (the table's default binds them with their traced parameters).
Rules for primitives with sub-jaxprs evaluate them through
`shrinker.run(jaxpr, consts, args, scope)` or re-trace them with
`shrinker.retrace(closed_jaxpr, scope)`; they read and rewrite the loop and
call parameters through `_core/params.py`, in the form the installed JAX uses.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from jaxprune.structured._core import params as params_lib
from jaxprune.structured._core.products import conv_axes
from jaxprune.structured._primitives import offsets

ShrinkRule = Callable[[Any, Any, tuple, int, list], list]


def bind(eqn: Any, invals: Sequence[Any], **params: Any) -> list:
  """Binds the equation's primitive to `invals`, with some parameters replaced."""
  bind_params = eqn.primitive.get_bind_params({**eqn.params, **params})
  with eqn.ctx.manager:
    out = eqn.primitive.bind(*invals, **bind_params)
  return list(out) if eqn.primitive.multiple_results else [out]


def same_params(shrinker, eqn, scope, index, invals) -> list:
  """Shape-generic primitives (elementwise, dot_general, ...): bind as traced."""
  del shrinker, scope, index
  return bind(eqn, invals)


def with_new_shape(param: str) -> ShrinkRule:
  """`broadcast_in_dim` / `reshape`: the output shape parameter takes the pruned shape."""

  def rule(shrinker, eqn, scope, index, invals):
    del index
    return bind(eqn, invals, **{param: shrinker.shape(scope, eqn.outvars[0])})

  return rule


def split(shrinker, eqn, scope, index, invals):
  del index
  axis = eqn.params['axis']
  sizes = tuple(shrinker.shape(scope, v)[axis] for v in eqn.outvars)
  return bind(eqn, invals, sizes=sizes)


def slice_(shrinker, eqn, scope, index, invals):
  del index
  x = invals[0]
  starts, limits = eqn.params['start_indices'], eqn.params['limit_indices']
  strides = eqn.params['strides'] or (1,) * len(starts)
  src, out = eqn.invars[0], eqn.outvars[0]
  for axis in range(len(starts)):
    kept_in = shrinker.kept(scope, src, axis)
    if kept_in is None and shrinker.kept(scope, out, axis) is None:
      x = jax.lax.slice_in_dim(x, starts[axis], limits[axis], strides[axis], axis)
      continue
    kept_out = shrinker.kept(scope, out, axis)
    n_out = out.aval.shape[axis]
    kept_out = np.arange(n_out) if kept_out is None else kept_out
    wanted = starts[axis] + kept_out * strides[axis]
    position = wanted if kept_in is None else np.searchsorted(kept_in, wanted)
    x = jnp.take(x, position, axis=axis)
  return [x]


def reduce_sum(shrinker, eqn, scope, index, invals):
  """With `trace(norms='renormalise')`, a sum over an axis that lost channels is
  scaled by full / kept, so a norm's mean divides by the kept width."""
  del index
  out = bind(eqn, invals)
  if shrinker.graph.norms != 'renormalise':
    return out
  operand, axes = eqn.invars[0], eqn.params['axes']
  full = int(np.prod([operand.aval.shape[a] for a in axes]))
  kept = int(np.prod([shrinker.shape(scope, operand)[a] for a in axes]))
  if kept == full:
    return out
  return [out[0] * jnp.asarray(full / kept, out[0].dtype)]


def conv(shrinker, eqn, scope, index, invals):
  del index
  groups = eqn.params['feature_group_count']
  if groups == 1:
    return bind(eqn, invals)
  axes = conv_axes(eqn)
  in_features = shrinker.shape(scope, eqn.invars[0])[axes.lhs_feature]
  per_group = shrinker.shape(scope, eqn.invars[1])[axes.rhs_in]
  if in_features % per_group:
    raise NotImplementedError(
      f'pruned callable: grouped conv with {in_features} input '
      f'features and {per_group} per group after pruning.'
    )
  return bind(eqn, invals, feature_group_count=in_features // per_group)


def slice_sizes(operand_index: int) -> ShrinkRule:
  """`gather` / `dynamic_slice`: full slices of a shrunk operand axis shrink with it."""

  def rule(shrinker, eqn, scope, index, invals):
    del index
    operand = eqn.invars[operand_index]
    new = shrinker.shape(scope, operand)
    sizes = list(eqn.params['slice_sizes'])
    dnums = eqn.params.get('dimension_numbers')
    batching = set(getattr(dnums, 'operand_batching_dims', ()))
    for axis, (old, now) in enumerate(zip(operand.aval.shape, new, strict=True)):
      if old != now and axis not in batching:  # a batching axis takes slices of size 1
        if sizes[axis] != old:
          raise NotImplementedError(
            f'pruned callable: {eqn.primitive.name} takes a partial slice of a pruned axis.'
          )
        sizes[axis] = now
    return bind(eqn, invals, slice_sizes=tuple(sizes))

  return rule


def _take(shrinker, eqn, scope, take: offsets.Take, x: Any) -> list:
  """A constant take (`offsets.Take`): the kept output positions' sources, found
  among the operand's kept positions."""
  wanted = take.positions
  kept_out = shrinker.kept(scope, eqn.outvars[0], take.out_axis)
  if kept_out is not None:
    wanted = wanted[kept_out]
  kept_in = shrinker.kept(scope, eqn.invars[0], take.axis)
  if kept_in is not None:
    wanted = np.searchsorted(kept_in, wanted)
  picked = jnp.take(x, wanted, axis=take.axis, mode='clip')
  return [jnp.moveaxis(picked, take.axis, take.out_axis)]


def gather(shrinker, eqn, scope, index, invals):
  """A gather that is one static slice (see `offsets.static_gather`) takes kept
  positions like `slice`, a constant take (`offsets.Take`) the kept positions'
  sources; other gathers follow `slice_sizes`."""
  slices = shrinker.graph.notes.get((scope, index))
  if isinstance(slices, offsets.Take):
    return _take(shrinker, eqn, scope, slices, invals[0])
  if slices is None:
    return slice_sizes(0)(shrinker, eqn, scope, index, invals)
  x, src, out = invals[0], eqn.invars[0], eqn.outvars[0]
  out_axis = 0
  for axis, (start, size, collapsed) in enumerate(slices):
    kept_in = shrinker.kept(scope, src, axis)
    kept_out = None if collapsed else shrinker.kept(scope, out, out_axis)
    if kept_in is not None or kept_out is not None or size != src.aval.shape[axis]:
      wanted = start + (np.arange(size) if kept_out is None else kept_out)
      x = jnp.take(x, wanted if kept_in is None else np.searchsorted(kept_in, wanted), axis=axis)
    out_axis += not collapsed
  collapsed_axes = tuple(a for a, (_, _, c) in enumerate(slices) if c)
  return [jnp.squeeze(x, collapsed_axes) if collapsed_axes else x]


@functools.cache
def inline(param: str) -> ShrinkRule:
  """Call primitives: evaluate the body in place at the pruned shapes."""

  def rule(shrinker, eqn, scope, index, invals):
    sub = params_lib.call_body(eqn, param)
    jaxpr, consts = (sub.jaxpr, sub.consts) if hasattr(sub, 'consts') else (sub, ())
    return shrinker.run(jaxpr, consts, invals, scope + (index, 0))

  return rule


def scan(shrinker, eqn, scope, index, invals):
  body = shrinker.retrace(params_lib.scan(eqn).body, scope + (index, 0))
  new = params_lib.scan_with_consts(eqn, jcore.ClosedJaxpr(_hoisted(body), ()), len(body.consts))
  return bind(eqn, [*body.consts, *invals], **new)


def while_loop(shrinker, eqn, scope, index, invals):
  loop = params_lib.while_loop(eqn)
  cond = shrinker.retrace(loop.cond, scope + (index, 0))
  body = shrinker.retrace(loop.body, scope + (index, 1))
  nc, nb = loop.cond_nconsts, loop.body_nconsts
  cond_consts, body_consts, carry = invals[:nc], invals[nc : nc + nb], invals[nc + nb :]
  cond_j = jcore.ClosedJaxpr(_hoisted(cond), ())
  body_j = jcore.ClosedJaxpr(_hoisted(body), ())
  new = [*cond.consts, *cond_consts, *body.consts, *body_consts, *carry]
  return bind(
    eqn,
    new,
    **params_lib.while_with_consts(eqn, cond_j, body_j, len(cond.consts), len(body.consts)),
  )


def cond(shrinker, eqn, scope, index, invals):
  branches = [
    shrinker.retrace(b, scope + (index, i)) for i, b in enumerate(params_lib.branches(eqn))
  ]
  # Branches must share a signature, so each takes every branch's constants.
  all_consts = [c for b in branches for c in b.consts]
  new_branches = []
  for i, b in enumerate(branches):
    before = sum(len(o.consts) for o in branches[:i])
    after = len(all_consts) - before - len(b.consts)
    new_branches.append(_pad_consts(b, before, after, all_consts))
  return bind(
    eqn, [invals[0], *all_consts, *invals[1:]], **params_lib.cond_with_branches(eqn, new_branches)
  )


def _hoisted(closed):
  """The jaxpr of `closed` with its consts turned into leading invars."""
  jaxpr = closed.jaxpr
  return jaxpr.replace(invars=[*jaxpr.constvars, *jaxpr.invars], constvars=[])


def _pad_consts(closed, before, after, all_consts):
  """`closed` taking all branches' consts as leading args, using only its own."""
  jaxpr = closed.jaxpr
  unused = lambda c: jcore.Var(jax.typeof(c))
  head = [unused(c) for c in all_consts[:before]]
  tail = [unused(c) for c in all_consts[before + len(closed.consts) :][:after]]
  new = jaxpr.replace(invars=[*head, *jaxpr.constvars, *tail, *jaxpr.invars], constvars=[])
  return jcore.ClosedJaxpr(new, ())
