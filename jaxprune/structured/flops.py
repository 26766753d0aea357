"""FLOPs of dot_general and conv equations, in total and per group channel.

A multiply-add counts 2. An equation's FLOPs are spread evenly over each of its
iteration axes (output axes, contracting axes, the kernel's input-feature
axis), so removing one channel that owns k of an axis's n positions saves
`flops * k / n`, summed over every iteration axis the group occupies. That is
exact for one channel and a first-order estimate for many (removing channels
from both sides of a layer saves a little less than the sum).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jax.extend import core as jcore


def _shape(var: Any) -> tuple[int, ...]:
  return tuple(var.aval.shape)


def _iteration(eqn: Any) -> tuple[float, list[tuple[Any, int]]]:
  """FLOPs of one equation and its iteration axes as (var, axis) pairs."""
  out = eqn.outvars[0]
  out_axes = [(out, a) for a in range(len(_shape(out)))]
  if eqn.primitive.name == 'dot_general':
    lhs = eqn.invars[0]
    (contract, _), _ = eqn.params['dimension_numbers']
    inner = float(np.prod([_shape(lhs)[a] for a in contract]))
    return 2.0 * np.prod(_shape(out)) * inner, out_axes + [(lhs, a) for a in contract]
  rhs = eqn.invars[1]
  _, rhs_spec, _ = eqn.params['dimension_numbers']
  window = float(np.prod([_shape(rhs)[a] for a in rhs_spec[1:]]))
  return 2.0 * np.prod(_shape(out)) * window, out_axes + [(rhs, rhs_spec[1])]


def count(flop_eqns: list[tuple[tuple[int, ...], Any, float]], var_axes: dict,
          n_groups: int) -> tuple[np.ndarray, float]:
  """Returns (FLOPs saved per channel of each group, total FLOPs).

  Args:
    flop_eqns: (scope, eqn, multiplier) of every dot_general and conv; the
      multiplier is the product of the enclosing scans' lengths.
    var_axes: `DependencyGraph.var_axes`.
    n_groups: number of groups.
  """
  per_channel = np.zeros(n_groups)
  total = 0.0
  for scope, eqn, multiplier in flop_eqns:
    eqn_flops, axes = _iteration(eqn)
    eqn_flops *= multiplier
    total += eqn_flops
    for var, axis in axes:
      if isinstance(var, jcore.Literal):
        continue
      parts = var_axes.get((scope, var), {}).get(axis, ())
      for part in parts:
        per_channel[part.group_id] += eqn_flops * part.indices.shape[1] / _shape(var)[axis]
  return per_channel, total
