"""Re-evaluates a traced jaxpr with channels removed: the pruned callable's engine.

The function cannot be traced again with smaller variables (its Flax modules
would refuse them), so the traced jaxpr is replayed equation by equation with
`primitive.bind`. Every variable's new shape follows from the graph's
`var_axes` and the plan; equations whose parameters carry shapes get them
rewritten (`broadcast_in_dim`, `reshape`, `split`, `slice`, conv
`feature_group_count`), sub-jaxprs of `jit` / custom derivative calls are
inlined, and `scan` / `while` / `cond` bodies are re-traced at their new shapes.
An equation none of whose inputs changed runs as traced and its outputs are
cut to the kept positions (constants, `iota`, broadcasts of scalars).

Every result is checked against the shape the graph predicts, so a primitive
the rules do not cover fails loudly instead of computing something else.
Register a rule for your own primitive with `register_shrink_rule`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

Scope = tuple[int, ...]


class Shrinker:
  """Shapes and kept positions of every jaxpr variable under one plan."""

  def __init__(self, graph: Any, removed: Mapping[int, np.ndarray]):
    self.graph = graph
    self.removed = {gid: np.asarray(r, np.int64) for gid, r in removed.items() if len(r)}
    self._kept: dict[tuple[Scope, Any, int], np.ndarray] = {}

  def kept(self, scope: Scope, var: Any, axis: int) -> np.ndarray | None:
    """Kept positions of `var`'s axis, or None when the axis keeps all."""
    if isinstance(var, jcore.Literal):
      return None
    key = (scope, var, axis)
    if key not in self._kept:
      parts = self.graph.var_axes.get((scope, var), {}).get(axis)
      size = var.aval.shape[axis]
      kept = None
      if parts:
        positions = self.graph.kept_positions(parts, size, self.removed)
        kept = positions if len(positions) != size else None
      self._kept[key] = kept
    return self._kept[key]

  def shape(self, scope: Scope, var: Any) -> tuple[int, ...]:
    shape = tuple(getattr(var.aval, 'shape', ()))
    return tuple(n if (k := self.kept(scope, var, a)) is None else len(k)
                 for a, n in enumerate(shape))

  def changed(self, scope: Scope, var: Any) -> bool:
    return self.shape(scope, var) != tuple(getattr(var.aval, 'shape', ()))

  def cut(self, scope: Scope, var: Any, value: Any) -> Any:
    """Takes the kept positions of a full-size value of `var`."""
    for axis in range(len(getattr(var.aval, 'shape', ()))):
      kept = self.kept(scope, var, axis)
      if kept is not None:
        value = jnp.take(value, kept, axis=axis)
    return value

  def avals(self, scope: Scope, variables: Sequence[Any]) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(self.shape(scope, v), v.aval.dtype) for v in variables]


# A rule: (shrinker, eqn, scope, eqn_index, invals) -> list of outputs.
ShrinkRule = Callable[[Shrinker, Any, Scope, int, list], list]
_RULES: dict[str, ShrinkRule] = {}


def register_shrink_rule(primitive_name: str, rule: ShrinkRule) -> None:
  """Teaches the pruned callable how to run `primitive_name` on smaller inputs.

  Args:
    primitive_name: `eqn.primitive.name`.
    rule: `rule(shrinker, eqn, scope, eqn_index, invals) -> outputs`; the
      outputs must have `shrinker.shape(scope, outvar)` shapes.
  """
  _RULES[primitive_name] = rule


def _bind(eqn: Any, invals: Sequence[Any], **params: Any) -> list:
  bind_params = eqn.primitive.get_bind_params({**eqn.params, **params})
  with eqn.ctx.manager:
    out = eqn.primitive.bind(*invals, **bind_params)
  return list(out) if eqn.primitive.multiple_results else [out]


def eval_jaxpr(shrinker: Shrinker, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any],
               scope: Scope = ()) -> list:
  """Evaluates an (open) jaxpr whose consts and args already have their new shapes."""
  env: dict[Any, Any] = {}

  def read(v):
    return v.val if isinstance(v, jcore.Literal) else env[v]

  for v, x in zip(jaxpr.constvars, consts, strict=True):
    env[v] = x
  for v, x in zip(jaxpr.invars, args, strict=True):
    env[v] = x
  for index, eqn in enumerate(jaxpr.eqns):
    invals = [read(v) for v in eqn.invars]
    if not any(shrinker.changed(scope, v) for v in eqn.invars):
      outs = [shrinker.cut(scope, v, x) for v, x in zip(eqn.outvars, _bind(eqn, invals),
                                                          strict=True)]
    else:
      rule = _RULES.get(eqn.primitive.name, _same_params)
      outs = rule(shrinker, eqn, scope, index, invals)
    for v, x in zip(eqn.outvars, outs, strict=True):
      if isinstance(v, jcore.DropVar):
        continue
      expected = shrinker.shape(scope, v)
      if tuple(jnp.shape(x)) != expected:
        raise NotImplementedError(
            f'pruned callable: primitive {eqn.primitive.name!r} gave shape {jnp.shape(x)}, the '
            f'channel groups predict {expected}. Register a rule for it with '
            'jaxprune.structured.register_shrink_rule.')
      env[v] = x
  return [read(v) for v in jaxpr.outvars]


def _same_params(shrinker, eqn, scope, index, invals):
  del shrinker, scope, index
  return _bind(eqn, invals)


def _with_new_shape(param):
  def rule(shrinker, eqn, scope, index, invals):
    del index
    return _bind(eqn, invals, **{param: shrinker.shape(scope, eqn.outvars[0])})
  return rule


def _split(shrinker, eqn, scope, index, invals):
  del index
  axis = eqn.params['axis']
  sizes = tuple(shrinker.shape(scope, v)[axis] for v in eqn.outvars)
  return _bind(eqn, invals, sizes=sizes)


def _slice(shrinker, eqn, scope, index, invals):
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
    position = (wanted if kept_in is None else np.searchsorted(kept_in, wanted))
    x = jnp.take(x, position, axis=axis)
  return [x]


def _conv(shrinker, eqn, scope, index, invals):
  del index
  lhs_spec, rhs_spec, _ = eqn.params['dimension_numbers']
  groups = eqn.params['feature_group_count']
  if groups == 1:
    return _bind(eqn, invals)
  in_features = shrinker.shape(scope, eqn.invars[0])[lhs_spec[1]]
  per_group = shrinker.shape(scope, eqn.invars[1])[rhs_spec[1]]
  if in_features % per_group:
    raise NotImplementedError(f'pruned callable: grouped conv with {in_features} input '
                              f'features and {per_group} per group after pruning.')
  return _bind(eqn, invals, feature_group_count=in_features // per_group)


def _slice_sizes(operand_index):
  """`gather` / `dynamic_slice`: full slices of a shrunk operand axis shrink with it."""
  def rule(shrinker, eqn, scope, index, invals):
    del index
    operand = eqn.invars[operand_index]
    new = shrinker.shape(scope, operand)
    sizes = list(eqn.params['slice_sizes'])
    for axis, (old, now) in enumerate(zip(operand.aval.shape, new, strict=True)):
      if old != now:
        if sizes[axis] != old:
          raise NotImplementedError(
              f'pruned callable: {eqn.primitive.name} takes a partial slice of a pruned axis.')
        sizes[axis] = now
    return _bind(eqn, invals, slice_sizes=tuple(sizes))
  return rule


def _inline(param):
  def rule(shrinker, eqn, scope, index, invals):
    sub = eqn.params[param]
    jaxpr, consts = (sub.jaxpr, sub.consts) if hasattr(sub, 'consts') else (sub, ())
    return eval_jaxpr(shrinker, jaxpr, consts, invals, scope + (index, 0))
  return rule


def _retrace(shrinker, closed, scope):
  """A ClosedJaxpr computing `closed` at the new shapes of its variables in `scope`."""
  fn = lambda *args: eval_jaxpr(shrinker, closed.jaxpr, closed.consts, args, scope)
  return jax.make_jaxpr(fn)(*shrinker.avals(scope, closed.jaxpr.invars))


def _scan(shrinker, eqn, scope, index, invals):
  body = _retrace(shrinker, eqn.params['jaxpr'], scope + (index, 0))
  return _bind_hoisting(eqn, invals, body, 'num_consts', 'jaxpr')


def _while(shrinker, eqn, scope, index, invals):
  p = eqn.params
  cond = _retrace(shrinker, p['cond_jaxpr'], scope + (index, 0))
  body = _retrace(shrinker, p['body_jaxpr'], scope + (index, 1))
  nc, nb = p['cond_nconsts'], p['body_nconsts']
  cond_consts, body_consts, carry = invals[:nc], invals[nc:nc + nb], invals[nc + nb:]
  cond_j = jcore.ClosedJaxpr(_hoisted(cond), ())
  body_j = jcore.ClosedJaxpr(_hoisted(body), ())
  new = [*cond.consts, *cond_consts, *body.consts, *body_consts, *carry]
  return _bind(eqn, new, cond_jaxpr=cond_j, body_jaxpr=body_j,
               cond_nconsts=nc + len(cond.consts), body_nconsts=nb + len(body.consts))


def _cond(shrinker, eqn, scope, index, invals):
  branches = [_retrace(shrinker, b, scope + (index, i))
              for i, b in enumerate(eqn.params['branches'])]
  # Branches must share a signature, so each takes every branch's constants.
  all_consts = [c for b in branches for c in b.consts]
  new_branches = []
  for i, b in enumerate(branches):
    before = sum(len(o.consts) for o in branches[:i])
    after = len(all_consts) - before - len(b.consts)
    new_branches.append(_pad_consts(b, before, after, all_consts))
  return _bind(eqn, [invals[0], *all_consts, *invals[1:]], branches=tuple(new_branches))


def _hoisted(closed):
  """The jaxpr of `closed` with its consts turned into leading invars."""
  jaxpr = closed.jaxpr
  return jaxpr.replace(invars=[*jaxpr.constvars, *jaxpr.invars], constvars=[])


def _pad_consts(closed, before, after, all_consts):
  """`closed` taking all branches' consts as leading args, using only its own."""
  jaxpr = closed.jaxpr
  unused = lambda c: jcore.Var(jax.typeof(c))
  head = [unused(c) for c in all_consts[:before]]
  tail = [unused(c) for c in all_consts[before + len(closed.consts):][:after]]
  new = jaxpr.replace(invars=[*head, *jaxpr.constvars, *tail, *jaxpr.invars], constvars=[])
  return jcore.ClosedJaxpr(new, ())


def _bind_hoisting(eqn, invals, body, nconsts_param, jaxpr_param):
  n = eqn.params[nconsts_param]
  return _bind(eqn, [*body.consts, *invals], **{jaxpr_param: jcore.ClosedJaxpr(_hoisted(body), ()),
                            nconsts_param: n + len(body.consts)})


for _name, _param in (('broadcast_in_dim', 'shape'), ('reshape', 'new_sizes')):
  register_shrink_rule(_name, _with_new_shape(_param))
register_shrink_rule('split', _split)
register_shrink_rule('slice', _slice)
register_shrink_rule('conv_general_dilated', _conv)
register_shrink_rule('gather', _slice_sizes(0))
register_shrink_rule('dynamic_slice', _slice_sizes(0))
for _name, _param in (('jit', 'jaxpr'), ('pjit', 'jaxpr'), ('closed_call', 'call_jaxpr'),
                      ('core_call', 'call_jaxpr'), ('remat2', 'jaxpr'), ('checkpoint', 'jaxpr'),
                      ('custom_jvp_call', 'call_jaxpr'), ('custom_vjp_call', 'call_jaxpr'),
                      ('custom_vjp_call_jaxpr', 'fun_jaxpr')):
  register_shrink_rule(_name, _inline(_param))
register_shrink_rule('scan', _scan)
register_shrink_rule('while', _while)
register_shrink_rule('cond', _cond)
