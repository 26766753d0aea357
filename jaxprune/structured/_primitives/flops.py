"""FLOPs of one equation, at any shapes: the `flops` column of the primitives table.

A flops rule is `rule(shape, eqn) -> (flops, iteration axes)`: `shape(var)` gives
the shape a variable has (as traced, or after a plan), `flops` counts a
multiply-add as 2, and the iteration axes are the `(var, axis)` pairs whose
positions the FLOPs are spread over evenly (output axes, contracting axes, a
conv kernel's input features). Removing one of n positions of an iteration
axis saves `flops / n` to first order; `cost.py` adds that up per channel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxprune.structured._core.products import conv_axes, dot_axes
from jaxprune.structured._core.shapes import static_prod

Shape = Callable[[Any], tuple]
FlopsRule = Callable[[Shape, Any], tuple[float, list[tuple[Any, int]]]]


def dot_general(shape: Shape, eqn: Any) -> tuple[float, list[tuple[Any, int]]]:
  lhs, out = eqn.invars[0], eqn.outvars[0]
  contract = dot_axes(eqn).contract[0]
  lhs_shape = shape(lhs)
  inner = static_prod([lhs_shape[a] for a in contract])
  axes = [(out, a) for a in range(len(shape(out)))] + [(lhs, a) for a in contract]
  return 2.0 * static_prod(shape(out)) * inner, axes


def conv_general_dilated(shape: Shape, eqn: Any) -> tuple[float, list[tuple[Any, int]]]:
  rhs, out = eqn.invars[1], eqn.outvars[0]
  axes_of = conv_axes(eqn)
  rhs_shape = shape(rhs)
  window = static_prod([rhs_shape[a] for a in (axes_of.rhs_in, *axes_of.rhs_spatial)])
  axes = [(out, a) for a in range(len(shape(out)))] + [(rhs, axes_of.rhs_in)]
  return 2.0 * static_prod(shape(out)) * window, axes
