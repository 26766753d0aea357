"""Which inputs of a jaxpr a function reads, and which values are constants.

A variables leaf that no equation reads (haiku's `mean_ema/hidden` in eval
mode, DINOv2's `mask_token` without a mask) would otherwise form a group of
its own that costs nothing to remove, and selectors would spend their budget
on it. Returning a leaf unchanged as its own new value (NNX state, Linen
mutable collections) is not a read.

A *constant* is a value computed from no variable and no input: a captured
array, `jnp.ones(...)` inside the function, `iota`, or anything computed from
those alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jaxprune.structured._core import jaxprs
from jaxprune.structured._primitives import control, traversal


def live_inputs(jaxpr: Any, live_outputs: Sequence[bool]) -> list[bool]:
  """Whether each invar of an open jaxpr is needed for the live outputs.

  An input is needed when a live equation reads it or it is a live output
  itself. A call's operands are followed into its body; every operand of any
  other live equation (loops, branches, effects) counts as read. (The one
  backward pass over a jaxpr; forward passes run on `jaxprs.evaluate`.)
  """
  is_var = jaxprs.is_var
  live = {v for v, used in zip(jaxpr.outvars, live_outputs, strict=True) if used and is_var(v)}
  for eqn in reversed(jaxpr.eqns):
    outs = [is_var(v) and v in live for v in eqn.outvars]
    if not any(outs) and not eqn.effects:
      continue
    body = traversal.call_body(eqn)
    if body is not None:
      used = live_inputs(control.inner(body), outs if not eqn.effects else [True] * len(outs))
      live |= {v for v, u in zip(eqn.invars, used, strict=True) if u and is_var(v)}
    else:
      live |= {v for v in eqn.invars if is_var(v)}
  return [v in live for v in jaxpr.invars]


def constants(jaxpr: Any, inputs_constant: Sequence[bool] | None = None) -> set[Any]:
  """The variables of an open jaxpr (not its sub-jaxprs) that hold constants.

  Args:
    jaxpr: the jaxpr.
    inputs_constant: per invar, whether it is a constant (default: none is).

  Returns:
    Its constvars and every output of an equation that has no variable
    operand that is not a constant.
  """
  inputs = list(inputs_constant or [False] * len(jaxpr.invars))
  found = set(jaxpr.constvars)
  found.update(v for v, constant in zip(jaxpr.invars, inputs, strict=True) if constant)

  def step(scope, index, eqn, operands_constant):
    del scope, index
    constant = not eqn.effects and all(operands_constant)
    if constant:
      found.update(v for v in eqn.outvars if jaxprs.is_var(v))
    return [constant] * len(eqn.outvars)

  jaxprs.evaluate(jaxpr, [True] * len(jaxpr.constvars), inputs, step, literal=lambda _: True)
  return found
