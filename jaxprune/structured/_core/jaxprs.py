"""The one traversal of jaxprs and the one evaluator every stage uses.

Which equations hold sub-jaxprs, and which of them are calls (a body that
takes the operands and gives the results), is read from the primitives table
(`table.sub_jaxprs`, `Primitive.body`) and nowhere else, and their parameters
through `_core/params.py` (the one reader of loop and call parameters, which
knows both forms of `scan`'s, before and after jax 0.11):

  `call_body(eqn)`   the body of a call whose operands and results map one to one;
  `equations(...)`   every equation of a jaxpr and of its sub-jaxprs, with its
                     scope (see `graph.VarKey`) and how often it runs per call;
  `evaluate(...)`    runs an open jaxpr in order, handing every equation and its
                     operands' values to a `step` hook that returns its results;
  `with_precision(...)`  the jaxpr with the matrix products and convolutions it left
                     at the default precision at another (the checks run at full
                     float32 precision, `_shrink/verify.py`).

The stages differ only in their hooks: the shrinker's step runs each equation
at its pruned shapes (`_shrink/shrinker.py`), the observer's runs it as traced
and shows the values to a callback (`_core/observe.py`), and the data-flow
analyses run it over booleans (which values are constants,
`_trace/dataflow.py`; which depend on the inputs, `_trace/kinds.py`). The
channel walk (`_trace/walker.py`) applies each equation's trace rule, and the
rules of loops and calls walk their sub-jaxprs (`_primitives/control.py`); the
one backward pass, which inputs a function reads, is `dataflow.live_inputs`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from jax import lax
from jax.extend import core as jcore

from jaxprune.structured._core import params as params_lib
from jaxprune.structured._core import products
from jaxprune.structured._primitives import control, table

Scope = tuple[int, ...]
# step(scope, eqn index, eqn, operand values) -> result values
Step = Callable[[Scope, int, Any, list], Sequence[Any]]


def is_var(v: Any) -> bool:
  """Whether `v` is a jaxpr variable (not a literal, not a dropped output)."""
  return isinstance(v, jcore.Var) and not isinstance(v, jcore.DropVar)


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


def literal_value(literal: Any) -> Any:
  return literal.val


def evaluate(
  jaxpr: Any,
  consts: Sequence[Any],
  args: Sequence[Any],
  step: Step,
  scope: Scope = (),
  literal: Callable[[Any], Any] = literal_value,
) -> list:
  """Runs an open jaxpr equation by equation; `step` computes each equation's results.

  Args:
    jaxpr: an open jaxpr.
    consts: values of its constvars.
    args: values of its invars.
    step: `step(scope, eqn_index, eqn, operand values) -> result values`.
    scope: the jaxpr's scope.
    literal: the value of a literal operand (its value by default; an analysis
      over booleans maps it to a flag).

  Returns:
    The values of its outvars.
  """
  env: dict[Any, Any] = {}

  def read(v):
    return literal(v) if isinstance(v, jcore.Literal) else env[v]

  env.update(zip(jaxpr.constvars, consts, strict=True))
  env.update(zip(jaxpr.invars, args, strict=True))
  for index, eqn in enumerate(jaxpr.eqns):
    outs = step(scope, index, eqn, [read(v) for v in eqn.invars])
    for v, x in zip(eqn.outvars, outs, strict=True):
      if not isinstance(v, jcore.DropVar):
        env[v] = x
  return [read(v) for v in jaxpr.outvars]


def with_precision(jaxpr: Any, precision: lax.Precision) -> Any:
  """The (open or closed) jaxpr with every `dot_general` and convolution at the backend's
  default precision (unset, or `Precision.DEFAULT`) at `precision`, in its sub-jaxprs too.

  The model's code sets a product's precision when it is traced; a replayed jaxpr keeps
  it, so `jax.default_matmul_precision` cannot reach it afterwards. Variables are kept:
  lookups by variable work on the result as on `jaxpr`.
  """
  if isinstance(jaxpr, jcore.ClosedJaxpr) and jaxpr.jaxpr is not jaxpr:  # jax 0.11: one class
    return jcore.ClosedJaxpr(with_precision(jaxpr.jaxpr, precision), jaxpr.consts)
  return jaxpr.replace(eqns=[eqn_with_precision(eqn, precision) for eqn in jaxpr.eqns])


def eqn_with_precision(eqn: Any, precision: lax.Precision) -> Any:
  """One equation as `with_precision` rewrites it."""
  params = {name: _sub_with_precision(value, precision) for name, value in eqn.params.items()}
  if eqn.primitive.name in products.PRODUCTS and params.get('precision') in (
    None,
    (lax.Precision.DEFAULT, lax.Precision.DEFAULT),
  ):
    params['precision'] = (precision, precision)
  return eqn.replace(params=params)


def _sub_with_precision(value: Any, precision: lax.Precision) -> Any:
  if isinstance(value, (jcore.Jaxpr, jcore.ClosedJaxpr)):
    return with_precision(value, precision)
  if (
    isinstance(value, tuple)
    and value
    and all(isinstance(v, (jcore.Jaxpr, jcore.ClosedJaxpr)) for v in value)
  ):  # cond's branches
    return tuple(with_precision(v, precision) for v in value)
  return value
