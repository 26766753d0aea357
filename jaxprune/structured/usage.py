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

from jax.extend import core as jcore

from jaxprune.structured import control, primitives


def _is_var(v: Any) -> bool:
  return isinstance(v, jcore.Var) and not isinstance(v, jcore.DropVar)


def live_inputs(jaxpr: Any, live_outputs: Sequence[bool]) -> list[bool]:
  """Whether each invar of an open jaxpr is needed for the live outputs.

  An input is needed when a live equation reads it or it is a live output
  itself. A call's operands are followed into its body; every operand of any
  other live equation (loops, branches, effects) counts as read.
  """
  live = {v for v, used in zip(jaxpr.outvars, live_outputs, strict=True) if used and _is_var(v)}
  for eqn in reversed(jaxpr.eqns):
    outs = [_is_var(v) and v in live for v in eqn.outvars]
    if not any(outs) and not eqn.effects:
      continue
    entry = primitives.lookup(eqn.primitive.name)
    body = control.inner(eqn.params[entry.body]) if entry and entry.body else None
    if body is not None and len(body.invars) == len(eqn.invars) and len(
        body.outvars) == len(eqn.outvars):
      used = live_inputs(body, outs if not eqn.effects else [True] * len(outs))
      live |= {v for v, u in zip(eqn.invars, used, strict=True) if u and _is_var(v)}
    else:
      live |= {v for v in eqn.invars if _is_var(v)}
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
  found = set(jaxpr.constvars)
  for var, constant in zip(jaxpr.invars, inputs_constant or [False] * len(jaxpr.invars),
                           strict=True):
    if constant:
      found.add(var)
  for eqn in jaxpr.eqns:
    if eqn.effects:
      continue
    if all(v in found for v in eqn.invars if isinstance(v, jcore.Var)):
      found.update(v for v in eqn.outvars if _is_var(v))
  return found
