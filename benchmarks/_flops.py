"""FLOPs as Torch-Pruning counts them, for benchmarks/width.py.

Torch-Pruning's counter (`tp.utils.count_ops_and_params`) hooks modules (Linear,
conv, norms), so it sees the products of an activation by a weight and not
attention's products of two activations (queries by keys, scores by values).
`count` counts both ways on the jaxpr of a callable, at the shapes it runs at
(a pruned callable's are the pruned ones): every dot_general and conv, a
multiply-add counted 2, as `jaxprune.structured.plan_flops` counts them, so the
total can be checked against it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
from jax.extend.core import ClosedJaxpr, Jaxpr, Var


def count(fn: Callable, variables: Any, *args: Any) -> tuple[float, float]:
  """`(all, with a weight)`: the FLOPs of `fn(variables, *args)`, and those of the products
  that have an operand computed from `variables` alone (not from `args`)."""
  closed = jax.make_jaxpr(fn)(variables, *args)
  n_variables = len(jax.tree.leaves(variables))
  from_inputs = [i >= n_variables for i in range(len(closed.jaxpr.invars))]
  sums = [0.0, 0.0]
  _walk(closed.jaxpr, from_inputs, sums)
  return sums[0], sums[1]


def _product_flops(eqn: Any) -> float:
  """A dot_general's or conv's FLOPs (a multiply-add is 2); 0 for other primitives."""
  out = math.prod(eqn.outvars[0].aval.shape)
  if eqn.primitive.name == 'dot_general':
    (contract, _), _ = eqn.params['dimension_numbers']
    lhs = eqn.invars[0].aval.shape
    return 2.0 * out * math.prod(lhs[a] for a in contract)
  if eqn.primitive.name == 'conv_general_dilated':
    _, rhs_spec, _ = eqn.params['dimension_numbers']
    rhs = eqn.invars[1].aval.shape
    return 2.0 * out * math.prod(rhs[a] for a in rhs_spec[1:])
  return 0.0


def _inner_jaxprs(eqn: Any) -> list[Jaxpr]:
  found = []
  for value in eqn.params.values():
    for item in value if isinstance(value, tuple | list) else (value,):
      if isinstance(item, ClosedJaxpr):
        found.append(item.jaxpr)
      elif isinstance(item, Jaxpr):
        found.append(item)
  return found


def _walk(jaxpr: Jaxpr, from_inputs: list[bool], sums: list[float]) -> list[bool]:
  """Adds the FLOPs of `jaxpr` to `sums`; returns which outputs depend on the inputs.

  Calls (pjit, custom_jvp, custom_vjp, remat) are followed into their body; loops and
  branches raise, as the FLOPs of a body run a number of times are not counted here.
  """
  dependent = {v for v, d in zip(jaxpr.invars, from_inputs, strict=True) if d}
  for eqn in jaxpr.eqns:
    operands = [isinstance(v, Var) and v in dependent for v in eqn.invars]
    product = _product_flops(eqn)
    sums[0] += product
    if product and not (operands[0] and operands[1]):
      sums[1] += product
    inner = _inner_jaxprs(eqn)
    if not inner:
      outputs = [any(operands)] * len(eqn.outvars)
    elif len(inner) == 1 and len(inner[0].invars) == len(eqn.invars) and 'length' not in eqn.params:
      outputs = _walk(inner[0], operands, sums)
    else:
      raise NotImplementedError(f'{eqn.primitive.name}: a loop or branch is not counted here')
    dependent.update(v for v, d in zip(eqn.outvars, outputs, strict=True) if d)
  return [isinstance(v, Var) and v in dependent for v in jaxpr.outvars]
