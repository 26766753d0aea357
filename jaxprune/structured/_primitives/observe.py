"""Runs a traced jaxpr as traced and hands chosen equations' values to a callback.

The norms probe (`_trace/norms.py`), activation importance (`_select/activations.py`) and
`verify`'s frozen-statistics check need the values of equations inside the
model, also inside call bodies (`jit`, custom derivatives), under the same
scopes the graph uses (see `graph.VarKey`). Call bodies are evaluated in
place; loops and branches run whole, so equations inside them are not seen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxprune.structured._core import jaxprs
from jaxprune.structured._primitives import control, shrink_rules, traversal

Scope = tuple[int, ...]
# watch(scope, eqn_index, eqn, invals, outvals)
Watch = Callable[[Scope, int, Any, list, list], None]


def evaluate(
  jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], scope: Scope, watch: Watch
) -> list:
  """Evaluates an open jaxpr on `args`, calling `watch` after every equation."""

  def step(s, index, eqn, invals):
    body = traversal.call_body(eqn)
    if body is not None:
      outs = jaxprs.evaluate(
        control.inner(body), getattr(body, 'consts', ()), invals, step, s + (index, 0)
      )
    else:
      outs = shrink_rules.bind(eqn, invals)
    watch(s, index, eqn, invals, outs)
    return outs

  return jaxprs.evaluate(jaxpr, consts, args, step, scope)


def collect(
  closed: Any,
  flat_args: Sequence[Any],
  scope: Scope,
  pick: Callable[[Scope, int, Any, list, list], Any],
) -> dict:
  """Values `pick` returns for the equations it does not return None for, jitted.

  Args:
    closed: a ClosedJaxpr (an entry point's `closed_jaxpr`).
    flat_args: its flat arguments (variables leaves, then the inputs).
    scope: the entry point's scope.
    pick: `pick(scope, eqn_index, eqn, invals, outvals)` -> an array (or
      pytree) computed from them, or None to skip the equation.

  Returns:
    `{(scope, eqn_index): picked value}` as numpy-backed arrays.
  """

  def run(flat):
    found = {}

    def watch(s, index, eqn, invals, outs):
      value = pick(s, index, eqn, invals, outs)
      if value is not None:
        found[(s, index)] = value

    evaluate(closed.jaxpr, closed.consts, flat, scope, watch)
    return found

  return jax.jit(run)(list(flat_args))
