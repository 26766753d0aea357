"""FLOPs of a traced function: in total, per group channel, and after a plan.

`costed_eqns` picks every equation with a `flops` rule in the primitives
table out of `jaxprs.equations` (sub-jaxprs too, with how often each runs per
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

from jaxprune.structured._core import jaxprs
from jaxprune.structured._core.graph import DependencyGraph
from jaxprune.structured._core.kept import PlanShapes
from jaxprune.structured._core.plan import Plan
from jaxprune.structured._core.shapes import is_static, var_shape
from jaxprune.structured._primitives import table

Scope = tuple[int, ...]


def costed_eqns(
  jaxpr: Any, scope: Scope = (), times: float = 1.0
) -> Iterator[tuple[Scope, Any, float, Any]]:
  """`(scope, eqn, times run per call, flops rule)` of every costed equation."""
  for eqn_scope, _, eqn, eqn_times in jaxprs.equations(jaxpr, scope, times):
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


def flops_kept(before: float, after: float) -> float:
  """FLOPs after a plan as a fraction of before (1.0 when there were none): the one
  convention every result reports (`PruneResult`, `channels.Shrunk`, the main job)."""
  return after / before if before else 1.0


def flops_text(kept: float) -> str:
  """`'29.2% kept, 3.42x fewer'` for `kept=0.292`."""
  fewer = f'{1 / kept:.2f}x fewer' if kept > 0 else 'no FLOPs left'
  return f'{kept:.1%} kept, {fewer}'


class FlopsReport:
  """The FLOPs part of a result (`PruneResult`, `channels.Shrunk`): the one convention.

  A result with `flops_before` (the dense model's FLOPs per call) and
  `flops_after` (the pruned model's) reports `flops_kept`, their fraction, and
  prints it as `FLOPs 1.2e+09 -> 3.5e+08 (29.2% kept, 3.42x fewer)`.
  """

  flops_before: float
  flops_after: float

  @property
  def flops_kept(self) -> float:
    """FLOPs of the pruned model as a fraction of the dense model's (0.25: 4x fewer)."""
    return flops_kept(self.flops_before, self.flops_after)

  def flops_line(self) -> str:
    return (
      f'FLOPs {self.flops_before:.3g} -> {self.flops_after:.3g} ({flops_text(self.flops_kept)})'
    )
