"""The one traversal of jaxprs every stage uses.

Which equations hold sub-jaxprs, and which of them are calls (a body that
takes the operands and gives the results), is read from the primitives table
(`table.sub_jaxprs`, `Primitive.body`) and nowhere else, and their parameters
through `_core/params.py` (the one reader of loop and call parameters, which
knows both forms of `scan`'s, before and after jax 0.11):

  `call_body(eqn)`   the body of a call whose operands and results map one to one;
  `equations(...)`   every equation of a jaxpr and of its sub-jaxprs, with its
                     scope (see `graph.VarKey`) and how often it runs per call.

It lives beside the table it reads, above the core: the evaluator it pairs
with (`_core/jaxprs.py`) needs no table. The channel walk
(`_trace/walker.py`) applies each equation's trace rule, and the rules of
loops and calls walk their sub-jaxprs (`_primitives/control.py`); the one
backward pass, which inputs a function reads, is `dataflow.live_inputs`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jaxprune.structured._core import params as params_lib
from jaxprune.structured._primitives import control, table

Scope = tuple[int, ...]


def call_body(eqn: Any) -> Any | None:
  """The (open or closed) body of a call equation whose body takes its operands and
  gives its results one to one, or None for any other equation."""
  entry = table.lookup(eqn.primitive.name)
  if entry is None or entry.body is None:
    return None
  body = params_lib.call_body(eqn, entry.body)
  jaxpr = control.inner(body)
  if len(jaxpr.invars) != len(eqn.invars) or len(jaxpr.outvars) != len(eqn.outvars):
    return None
  return body


def equations(
  jaxpr: Any, scope: Scope = (), times: float = 1.0
) -> Iterator[tuple[Scope, int, Any, float]]:
  """`(scope, eqn index, eqn, times run per call)` of every equation, sub-jaxprs too.

  An equation comes before the equations of its sub-jaxprs; a scan's body runs
  `length` times per call, a while body once (its trip count is unknown when
  tracing), each cond branch 1 / number of branches.
  """
  for index, eqn in enumerate(control.inner(jaxpr).eqns):
    yield scope, index, eqn, times
    for sub_index, sub, sub_times in table.sub_jaxprs(eqn):
      yield from equations(sub, scope + (index, sub_index), times * sub_times)
