"""Shapes and kept positions of every jaxpr variable under one plan.

A variable's axis keeps the positions that survive the plan's removals in
every group owning part of it (`DependencyGraph.kept_positions` of its
`var_axes`). The FLOPs counter reads the shapes; the shrinker (`_shrink`)
also runs the jaxpr at them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from jaxprune.structured._core.graph import DependencyGraph

Scope = tuple[int, ...]


class PlanShapes:
  """Shapes and kept positions of every jaxpr variable under one plan."""

  def __init__(self, graph: DependencyGraph, removed: Mapping[int, np.ndarray]):
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
      kept = None
      if parts:
        size = var.aval.shape[axis]
        positions = self.graph.kept_positions(parts, size, self.removed)
        kept = positions if len(positions) != size else None
      self._kept[key] = kept
    return self._kept[key]

  def shape(self, scope: Scope, var: Any) -> tuple:
    shape = tuple(getattr(var.aval, 'shape', ()))
    return tuple(
      n if (k := self.kept(scope, var, a)) is None else len(k) for a, n in enumerate(shape)
    )

  def changed(self, scope: Scope, var: Any) -> bool:
    return any(
      self.kept(scope, var, a) is not None for a in range(len(getattr(var.aval, 'shape', ())))
    )

  def cut(self, scope: Scope, var: Any, value: Any) -> Any:
    """Takes the kept positions of a full-size value of `var`."""
    for axis in range(len(getattr(var.aval, 'shape', ()))):
      kept = self.kept(scope, var, axis)
      if kept is not None:
        value = jnp.take(value, kept, axis=axis)
    return value

  def avals(self, scope: Scope, variables: Sequence[Any]) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(self.shape(scope, v), v.aval.dtype) for v in variables]
