"""FLOPs of a traced function: in total, per group channel, and after a plan.

`costed_eqns` picks every equation with a `flops` rule in the primitives
table out of `traversal.equations` (sub-jaxprs too, with how often each runs per
call: a scan's length; a cond branch's 1 / number of branches; one iteration
of a while loop). The same rules count the dense model, the first-order saving
per channel (used to rank channels) and the exact FLOPs after a plan (used
by the FLOPs selectors: removing half the input and half the output channels
of a conv removes 3/4 of its FLOPs, not all of them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from jax.extend import core as jcore

from jaxprune.structured._core.graph import DependencyGraph
from jaxprune.structured._core.kept import PlanShapes
from jaxprune.structured._core.plan import Plan
from jaxprune.structured._core.shapes import is_static, var_shape
from jaxprune.structured._primitives import table, traversal

Scope = tuple[int, ...]


def costed_eqns(
  jaxpr: Any, scope: Scope = (), times: float = 1.0
) -> Iterator[tuple[Scope, Any, float, Any]]:
  """`(scope, eqn, times run per call, flops rule)` of every costed equation."""
  for eqn_scope, _, eqn, eqn_times in traversal.equations(jaxpr, scope, times):
    entry = table.lookup(eqn.primitive.name)
    if entry is not None and entry.flops is not None:
      yield eqn_scope, eqn, eqn_times, entry.flops


def count(jaxpr: Any, var_axes: dict, n_groups: int, scope: Scope = ()) -> tuple[np.ndarray, float]:
  """FLOPs saved per channel of each group (first order) and the total, as traced.

  Args:
    jaxpr: the traced (closed) jaxpr.
    var_axes: `DependencyGraph.var_axes`.
    n_groups: number of groups.
    scope: the jaxpr's scope.

  Returns:
    `(per_channel, total)`: removing one channel that owns k of an iteration
    axis's n positions saves `flops * k / n`, summed over the axes it occupies.
  """
  per_channel = np.zeros(n_groups)
  total = 0.0
  for eqn_scope, eqn, times, rule in costed_eqns(jaxpr, scope):
    eqn_flops, axes = rule(var_shape, eqn)
    eqn_flops *= times
    total += eqn_flops
    for var, axis in axes:
      if isinstance(var, jcore.Literal) or not is_static(var_shape(var)[axis]):
        continue
      for part in var_axes.get((eqn_scope, var), {}).get(axis, ()):
        per_channel[part.group_id] += eqn_flops * part.indices.shape[1] / var_shape(var)[axis]
  return per_channel, total


def plan_flops(graph: DependencyGraph, plan: Plan) -> float:
  """FLOPs per call of the traced function after applying `plan`.

  Args:
    graph: a DependencyGraph.
    plan: a `Plan` (an empty plan gives the dense model's FLOPs).

  Returns:
    The FLOPs of every costed primitive (dot_general and conv; a multiply-add
    counts 2), at the pruned shapes.
  """
  return count_flops(graph, plan)


def count_flops(
  graph: DependencyGraph, plan: Plan, skip: Callable[[Scope, Any], bool] | None = None
) -> float:
  """The one FLOPs counter: `plan_flops`, leaving out the equations `skip(scope, eqn)`
  picks (e.g. `kinds.activation_products` counts as layer-based counters do)."""
  shapes = PlanShapes(graph, plan.removed)
  total = 0.0
  for scope, eqn, times, rule in costed_eqns(graph.closed_jaxpr):
    if skip is None or not skip(scope, eqn):
      total += times * rule(lambda var, scope=scope: shapes.shape(scope, var), eqn)[0]
  return total
