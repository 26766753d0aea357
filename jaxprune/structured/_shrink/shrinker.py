"""Re-evaluates a traced jaxpr with channels removed: the pruned callable's engine.

The function cannot be traced again with smaller variables (its Flax modules
would refuse them), so the traced jaxpr is replayed equation by equation with
`primitive.bind` (`jaxprs.evaluate`, with `Shrinker.step` as its hook). Every
variable's new shape follows from the graph's `var_axes` and the plan; each
primitive runs through its `shrink` rule in the primitives table (shape
parameters rewritten, sub-jaxprs inlined or re-traced). An equation none of
whose inputs changed runs as traced and its outputs are cut to the kept
positions (broadcasts of scalars). Constants keep their full size; each
equation that reads one takes the positions its own use keeps
(`DependencyGraph.proxied`).

Every result is checked against the shape the graph predicts, so a primitive
the table does not cover fails loudly instead of computing something else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from jaxprune.structured._core import jaxprs
from jaxprune.structured._core.graph import DependencyGraph
from jaxprune.structured._core.kept import PlanShapes
from jaxprune.structured._primitives import shrink_rules, table

Scope = tuple[int, ...]


class Shrinker(PlanShapes):
  """Runs jaxprs at the shapes of one plan (`PlanShapes`), equation by equation."""

  def __init__(self, graph: DependencyGraph, removed: Mapping[int, np.ndarray]):
    super().__init__(graph, removed)
    # (scope, eqn index) -> full-size outputs used instead of computing them
    # (`verify` freezes norm statistics to the dense model's this way).
    self.overrides: dict[tuple[Scope, int], Sequence[Any]] = {}

  def run(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], scope: Scope = ()) -> list:
    """Evaluates an (open) jaxpr whose consts and args already have their new shapes."""
    return jaxprs.evaluate(jaxpr, consts, args, self.step, scope)

  def retrace(self, closed: Any, scope: Scope) -> jcore.ClosedJaxpr:
    """A ClosedJaxpr computing `closed` at the new shapes of its variables in `scope`."""
    fn = lambda *args: self.run(closed.jaxpr, closed.consts, args, scope)
    return jax.make_jaxpr(fn)(*self.avals(scope, closed.jaxpr.invars))

  def step(self, scope: Scope, index: int, eqn: Any, invals: list) -> list:
    """The evaluator's hook: one equation at the new shapes, its results checked."""
    proxied = self.graph.proxied.get((scope, index))
    if proxied is not None:
      invals = [
        x if var is proxy else self.cut(scope, proxy, x)
        for var, proxy, x in zip(eqn.invars, proxied.invars, invals, strict=True)
      ]
      eqn = proxied
    if (scope, index) in self.overrides:
      outs = [
        self.cut(scope, v, x)
        for v, x in zip(eqn.outvars, self.overrides[(scope, index)], strict=True)
      ]
    elif not any(self.changed(scope, v) for v in eqn.invars):
      outs = [
        self.cut(scope, v, x)
        for v, x in zip(eqn.outvars, shrink_rules.bind(eqn, invals), strict=True)
      ]
    else:
      outs = _shrink_rule(eqn)(self, eqn, scope, index, invals)
    for v, x in zip(eqn.outvars, outs, strict=True):
      expected = None if isinstance(v, jcore.DropVar) else self.shape(scope, v)
      if expected is not None and tuple(jnp.shape(x)) != expected:
        raise NotImplementedError(
          f'pruned callable: primitive {eqn.primitive.name!r} gave shape {jnp.shape(x)}, the '
          f'channel groups predict {expected}. Register a rule for it with '
          'jaxprune.structured.register_shrink_rule.'
        )
    return outs


def _shrink_rule(eqn: Any) -> shrink_rules.ShrinkRule:
  entry = table.lookup(eqn.primitive.name)
  if entry is not None and entry.shrink is not None:
    return entry.shrink
  if entry is not None and entry.sub_jaxprs(eqn):
    raise NotImplementedError(
      f'pruned callable: primitive {eqn.primitive.name!r} holds sub-jaxprs and has no shrink '
      'rule; register one with jaxprune.structured.register_shrink_rule.'
    )
  return shrink_rules.same_params
