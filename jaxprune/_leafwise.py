"""Outputs of a whole-tree function, each recomputed on its own wherever it is read.

`pruned`'s mask update reads the weights as the optimizer will store them. Computing
them once stores a copy of every pruned weight (as much memory as the params) for the
counting passes to read. `recomputed` instead gives each output as a function of a
token that recomputes it from the inputs it needs (a leaf's gradient, optimizer state
and param), so that every pass computes it where it reads it and stores nothing.

Values of at most `HOISTED_SIZE` elements (a step count, a bias correction, a global
norm) are computed once, before the passes: a pass recomputes only its own leaf's
arithmetic, never a reduction over all the leaves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.extend import core

from jaxprune import _counting as counting

HOISTED_SIZE = 4096


def _is_small(var: Any) -> bool:
  shape = getattr(var.aval, 'shape', None)
  return shape is None or math.prod(shape) <= HOISTED_SIZE


def _slice(jaxpr: core.Jaxpr, output: Any, inputs: set[Any]) -> tuple[list[Any], list[Any]]:
  """(the equations in order, the variables they read from outside) that compute `output`
  from `inputs` and from small values, where the walk back stops."""
  producers = {v: eqn for eqn in jaxpr.eqns for v in eqn.outvars}
  needed, reads, stack = set(), [], [output]
  while stack:
    var = stack.pop()
    if not isinstance(var, core.Var) or var in needed:
      continue
    needed.add(var)
    if var in inputs or _is_small(var) or var not in producers:
      reads.append(var)
      continue
    stack.extend(producers[var].invars)
  eqns = [
    e for e in jaxpr.eqns if any(v in needed and v not in reads for v in e.outvars)
  ]
  return eqns, reads


def recomputed(
  fn: Callable[..., Sequence[Any]], args: Any, outputs: Sequence[int]
) -> list[Callable[[Any], Any]]:
  """For each index in `outputs`, `token -> fn(*args)[index]`, read through
  `counting.fresh(..., token)`: XLA computes it again at every call with a new token."""
  flat_args, tree = jax.tree.flatten(args)
  closed = jax.make_jaxpr(lambda *flat: list(fn(*jax.tree.unflatten(tree, flat))))(*flat_args)
  jaxpr = closed.jaxpr
  values = dict(zip(jaxpr.constvars, closed.consts, strict=True))
  values.update(zip(jaxpr.invars, flat_args, strict=True))
  inputs = set(values)
  slices = [_slice(jaxpr, jaxpr.outvars[i], inputs) for i in outputs]
  hoisted = list(dict.fromkeys(v for _, reads in slices for v in reads if v not in inputs))
  # Every small value the slices read, in one evaluation (XLA drops the rest of it).
  prologue = core.Jaxpr(jaxpr.constvars, jaxpr.invars, hoisted, jaxpr.eqns, jaxpr.effects)
  values.update(
    zip(hoisted, jax.core.eval_jaxpr(prologue, closed.consts, *flat_args), strict=True)
  )

  def leaf(eqns, reads, output):
    operands = [values[v] for v in reads]
    literals = [v.val for e in eqns for v in e.invars if isinstance(v, core.Literal)]

    def values_at(token):
      # Literals go through the barrier too: a constant broadcast to a leaf's shape is
      # one instruction that every pass would share, and XLA:CPU stores a broadcast its
      # library reductions share rather than compute it in each of them.
      fresh, fresh_literals = counting.fresh((operands, literals), token)
      return _evaluate(eqns, dict(zip(reads, fresh, strict=True)), iter(fresh_literals), output)

    return values_at

  return [
    leaf(eqns, reads, jaxpr.outvars[i]) for (eqns, reads), i in zip(slices, outputs, strict=True)
  ]


def _evaluate(eqns: list[Any], env: dict[Any, Any], literals: Any, output: Any) -> Any:
  """`output` of `eqns` from the values in `env`, the eqns' literals taken in order from
  `literals` (as `jax.core.eval_jaxpr` does, with the literals replaced)."""
  for eqn in eqns:
    args = [env[v] if isinstance(v, core.Var) else next(literals) for v in eqn.invars]
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns, params = params if isinstance(params, tuple) else ((), params)
    out = eqn.primitive.bind(*subfuns, *args, **params)
    env.update(zip(eqn.outvars, out if eqn.primitive.multiple_results else [out], strict=True))
  return env[output] if isinstance(output, core.Var) else output.val
