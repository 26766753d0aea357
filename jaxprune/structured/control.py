"""Rules for primitives that hold sub-jaxprs: calls, scan, while, cond.

A sub-jaxpr is walked in its own scope (see `groups.VarKey`), so a jaxpr that
is shared by several call sites (e.g. `relu`'s) gets separate ids per site.
"""

from __future__ import annotations

from typing import Any

from jaxprune.structured import rules

_CALL_PARAMS = {
    'jit': 'jaxpr', 'pjit': 'jaxpr', 'closed_call': 'call_jaxpr', 'core_call': 'call_jaxpr',
    'remat2': 'jaxpr', 'checkpoint': 'jaxpr', 'custom_jvp_call': 'call_jaxpr',
    'custom_vjp_call': 'call_jaxpr', 'custom_vjp_call_jaxpr': 'fun_jaxpr',
    'custom_jvp_call_jaxpr': 'fun_jaxpr', 'composite': 'jaxpr',
}


def _inner(jaxpr: Any) -> Any:
  return getattr(jaxpr, 'jaxpr', jaxpr)


def _rank(var: Any) -> int:
  return len(getattr(var.aval, 'shape', ()))


def _tie(ctx, outer: list[Any], inner: list[Any], scope: tuple[int, ...],
         shift: int = 0, outer_scope: tuple[int, ...] | None = None) -> None:
  """Joins axis a + shift of `outer[i]` with axis a of `inner[i]` (in `scope`)."""
  for out_var, in_var in zip(outer, inner, strict=True):
    for axis in range(_rank(in_var)):
      ctx.join_axes(out_var, axis + shift, in_var, axis, outer_scope, scope)


def _call(ctx, eqn) -> None:
  jaxpr = eqn.params[_CALL_PARAMS[eqn.primitive.name]]
  inner = _inner(jaxpr)
  if len(inner.invars) != len(eqn.invars) or len(inner.outvars) != len(eqn.outvars):
    rules.block_all(ctx, eqn)
    return
  scope = ctx.walk(jaxpr, 0)
  _tie(ctx, eqn.invars, inner.invars, scope)
  _tie(ctx, eqn.outvars, inner.outvars, scope)


def _block_iteration_axis(ctx, variables: list[Any]) -> None:
  for var in variables:
    if _rank(var):
      ctx.block_ids(ctx.ids(var, 0), 'scan iteration axis')


def _scan(ctx, eqn) -> None:
  params = eqn.params
  inner = _inner(params['jaxpr'])
  scope = ctx.walk(params['jaxpr'], 0, multiplier=params['length'])
  n_fixed = params['num_consts'] + params['num_carry']
  n_carry = params['num_carry']
  _tie(ctx, eqn.invars[:n_fixed], inner.invars[:n_fixed], scope)
  _tie(ctx, eqn.invars[n_fixed:], inner.invars[n_fixed:], scope, shift=1)
  _tie(ctx, eqn.outvars[:n_carry], inner.outvars[:n_carry], scope)
  carry_in = inner.invars[params['num_consts']:n_fixed]
  _tie(ctx, inner.outvars[:n_carry], carry_in, scope, outer_scope=scope)
  _tie(ctx, eqn.outvars[n_carry:], inner.outvars[n_carry:], scope, shift=1)
  _block_iteration_axis(ctx, [*eqn.invars[n_fixed:], *eqn.outvars[n_carry:]])


def _while(ctx, eqn) -> None:
  params = eqn.params
  n_cond, n_body = params['cond_nconsts'], params['body_nconsts']
  cond_scope = ctx.walk(params['cond_jaxpr'], 0)
  body_scope = ctx.walk(params['body_jaxpr'], 1)
  cond, body = _inner(params['cond_jaxpr']), _inner(params['body_jaxpr'])
  carry = eqn.invars[n_cond + n_body:]
  _tie(ctx, eqn.invars[:n_cond], cond.invars[:n_cond], cond_scope)
  _tie(ctx, carry, cond.invars[n_cond:], cond_scope)
  _tie(ctx, eqn.invars[n_cond:n_cond + n_body], body.invars[:n_body], body_scope)
  _tie(ctx, carry, body.invars[n_body:], body_scope)
  _tie(ctx, eqn.outvars, body.outvars, body_scope)
  _tie(ctx, carry, eqn.outvars, ctx.scope)


def _cond(ctx, eqn) -> None:
  operands = eqn.invars[1:]
  for index, branch in enumerate(eqn.params['branches']):
    scope = ctx.walk(branch, index)
    _tie(ctx, operands, _inner(branch).invars, scope)
    _tie(ctx, eqn.outvars, _inner(branch).outvars, scope)


def register() -> None:
  """Adds the rules of this module to `rules.RULES`."""
  for name in _CALL_PARAMS:
    rules.RULES[name] = _call
  rules.RULES.update({'scan': _scan, 'while': _while, 'cond': _cond})
