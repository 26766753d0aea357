"""Channel rules and sub-jaxpr lists for primitives that hold sub-jaxprs.

Calls (`jit`, `remat2`, custom derivatives, `composite`, ...) run one body on
their operands; `scan`, `while` and `cond` have their own layouts. A
sub-jaxpr is walked in its own scope (see `graph.VarKey`), so a jaxpr that is
shared by several call sites (e.g. `relu`'s) gets separate ids per site.

`*_subjaxprs(eqn)` list `(sub_index, jaxpr, times run per call)`; the
primitives table is the only place that says which primitive uses which.
The parameters of these primitives are read through `_core/params.py` (scan's
changed in jax 0.11), never from `eqn.params` here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from jaxprune.structured._core import params as params_lib
from jaxprune.structured._core.shapes import is_static, var_shape
from jaxprune.structured._primitives.rules import block_all

SubJaxprs = Callable[[Any], list[tuple[int, Any, float]]]


def inner(jaxpr: Any) -> Any:
  """The open jaxpr of an open or closed jaxpr."""
  return getattr(jaxpr, 'jaxpr', jaxpr)


def _tie(
  ctx,
  outer: list[Any],
  inner_vars: list[Any],
  scope: tuple[int, ...],
  shift: int = 0,
  outer_scope: tuple[int, ...] | None = None,
) -> None:
  """Joins axis a + shift of `outer[i]` with axis a of `inner_vars[i]` (in `scope`)."""
  for out_var, in_var in zip(outer, inner_vars, strict=True):
    for axis in range(len(var_shape(in_var))):
      ctx.join_axes(out_var, axis + shift, in_var, axis, outer_scope, scope)


@functools.cache
def call(param: str) -> Callable[[Any, Any], None]:
  """The rule of a call primitive whose body is `eqn.params[param]` (one per param)."""

  def rule(ctx, eqn) -> None:
    closed = params_lib.call_body(eqn, param)
    body = inner(closed)
    if len(body.invars) != len(eqn.invars) or len(body.outvars) != len(eqn.outvars):
      block_all(ctx, eqn)
      return
    scope = ctx.walk(closed, 0)
    _tie(ctx, eqn.invars, body.invars, scope)
    _tie(ctx, eqn.outvars, body.outvars, scope)

  return rule


def _block_iteration_axis(ctx, variables: list[Any]) -> None:
  for var in variables:
    if var_shape(var):
      ctx.block_ids(ctx.ids(var, 0), 'scan iteration axis')


def scan(ctx, eqn) -> None:
  loop = params_lib.scan(eqn)
  body = inner(loop.body)
  scope = ctx.walk(loop.body, 0)
  n_fixed, n_carry = loop.n_fixed, loop.n_carry
  _tie(ctx, eqn.invars[:n_fixed], body.invars[:n_fixed], scope)
  _tie(ctx, eqn.invars[n_fixed:], body.invars[n_fixed:], scope, shift=1)
  _tie(ctx, eqn.outvars[:n_carry], body.outvars[:n_carry], scope)
  carry_in = body.invars[loop.n_consts : n_fixed]
  _tie(ctx, body.outvars[:n_carry], carry_in, scope, outer_scope=scope)
  _tie(ctx, eqn.outvars[n_carry:], body.outvars[n_carry:], scope, shift=1)
  _block_iteration_axis(ctx, [*eqn.invars[n_fixed:], *eqn.outvars[n_carry:]])


def scan_subjaxprs(eqn: Any) -> list[tuple[int, Any, float]]:
  # A symbolic length (a sequence exported as `jax.export.symbolic_shape('b, t')`)
  # counts as unknown, like every symbolic dimension (`shapes.static_prod`).
  loop = params_lib.scan(eqn)
  length = loop.length
  return [(0, loop.body, float(length) if is_static(length) else math.nan)]


def while_loop(ctx, eqn) -> None:
  loop = params_lib.while_loop(eqn)
  n_cond, n_body = loop.cond_nconsts, loop.body_nconsts
  cond_scope = ctx.walk(loop.cond, 0)
  body_scope = ctx.walk(loop.body, 1)
  cond, body = inner(loop.cond), inner(loop.body)
  carry = eqn.invars[n_cond + n_body :]
  _tie(ctx, eqn.invars[:n_cond], cond.invars[:n_cond], cond_scope)
  _tie(ctx, carry, cond.invars[n_cond:], cond_scope)
  _tie(ctx, eqn.invars[n_cond : n_cond + n_body], body.invars[:n_body], body_scope)
  _tie(ctx, carry, body.invars[n_body:], body_scope)
  _tie(ctx, eqn.outvars, body.outvars, body_scope)
  _tie(ctx, carry, eqn.outvars, ctx.scope)


def while_subjaxprs(eqn: Any) -> list[tuple[int, Any, float]]:
  # The trip count is unknown when tracing: FLOPs count one iteration.
  loop = params_lib.while_loop(eqn)
  return [(0, loop.cond, 1.0), (1, loop.body, 1.0)]


def cond(ctx, eqn) -> None:
  operands = eqn.invars[1:]
  for index, branch in enumerate(params_lib.branches(eqn)):
    scope = ctx.walk(branch, index)
    _tie(ctx, operands, inner(branch).invars, scope)
    _tie(ctx, eqn.outvars, inner(branch).outvars, scope)


def cond_subjaxprs(eqn: Any) -> list[tuple[int, Any, float]]:
  # One branch runs per call and which is unknown when tracing: FLOPs are the
  # branches' mean (every branch equally likely).
  branches = params_lib.branches(eqn)
  return [(i, b, 1.0 / len(branches)) for i, b in enumerate(branches)]
