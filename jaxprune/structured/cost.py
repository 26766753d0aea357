"""FLOPs of the model a plan gives, counted exactly on the traced jaxpr.

Counts dot_general and conv equations (a multiply-add is 2 FLOPs) at the
shapes they have after removing the plan's channels. A first-order estimate
(`flops_per_channel` times channels removed) is far off when both sides of a
conv shrink (halving input and output channels removes 3/4 of its FLOPs, not
all of it), so the FLOPs selectors use this count.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxprune.structured.interpret import Shrinker


def sub_jaxprs(eqn: Any) -> list[tuple[int, Any, float]]:
  """`(sub_index, open jaxpr, times run)` for the sub-jaxprs of an equation."""
  p = eqn.params
  name = eqn.primitive.name
  if name == 'while':
    return [(0, p['cond_jaxpr'].jaxpr, 1.0), (1, p['body_jaxpr'].jaxpr, 1.0)]
  if name == 'cond':
    return [(i, b.jaxpr, 1.0 / len(p['branches'])) for i, b in enumerate(p['branches'])]
  if name == 'scan':
    return [(0, p['jaxpr'].jaxpr, float(p['length']))]
  for key in ('jaxpr', 'call_jaxpr', 'fun_jaxpr'):
    if key in p:
      sub = p[key]
      return [(0, sub.jaxpr if hasattr(sub, 'consts') else sub, 1.0)]
  return []


def _eqn_flops(shrinker: Shrinker, eqn: Any, scope: tuple[int, ...]) -> float:
  name = eqn.primitive.name
  if name == 'dot_general':
    (lhs_contract, _), _ = eqn.params['dimension_numbers']
    lhs = shrinker.shape(scope, eqn.invars[0])
    out = shrinker.shape(scope, eqn.outvars[0])
    return 2.0 * float(np.prod(out)) * float(np.prod([lhs[a] for a in lhs_contract]))
  if name == 'conv_general_dilated':
    _, rhs_spec, _ = eqn.params['dimension_numbers']
    rhs = shrinker.shape(scope, eqn.invars[1])
    out = shrinker.shape(scope, eqn.outvars[0])
    return 2.0 * float(np.prod(out)) * float(np.prod(rhs)) / rhs[rhs_spec[0]]
  return 0.0


def jaxpr_flops(shrinker: Shrinker, jaxpr: Any, scope: tuple[int, ...] = ()) -> float:
  """FLOPs of one jaxpr (recursing into sub-jaxprs) at the shrinker's shapes."""
  total = 0.0
  for index, eqn in enumerate(jaxpr.eqns):
    total += _eqn_flops(shrinker, eqn, scope)
    for sub_index, sub, times in sub_jaxprs(eqn):
      total += times * jaxpr_flops(shrinker, sub, scope + (index, sub_index))
  return total


def plan_flops(graph: Any, plan: Any) -> float:
  """FLOPs per call of the traced function after applying `plan`.

  Args:
    graph: a DependencyGraph.
    plan: a `Plan` (an empty plan gives the dense model's FLOPs).

  Returns:
    dot_general + conv FLOPs (multiply-add = 2).
  """
  return jaxpr_flops(Shrinker(graph, plan.removed), graph.closed_jaxpr.jaxpr)
