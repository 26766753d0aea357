"""The one evaluator of jaxprs every stage uses, and the precision its checks run at.

  `evaluate(...)`    runs an open jaxpr in order, handing every equation and its
                     operands' values to a `step` hook that returns its results;
  `with_precision(...)`  the jaxpr with the matrix products and convolutions it left
                     at the default precision at another (the checks run at full
                     float32 precision, `_shrink/verify.py`).

The stages differ only in their hooks: the shrinker's step runs each equation
at its pruned shapes (`_shrink/shrinker.py`), the observer's runs it as traced
and shows the values to a callback (`_primitives/observe.py`), and the data-flow
analyses run it over booleans (which values are constants,
`_trace/dataflow.py`; which depend on the inputs, `_trace/kinds.py`). The one
traversal, which needs the primitives table to know which equations hold
sub-jaxprs, is `_primitives/traversal.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from jax import lax
from jax.extend import core as jcore

from jaxprune.structured._core import products

Scope = tuple[int, ...]
# step(scope, eqn index, eqn, operand values) -> result values
Step = Callable[[Scope, int, Any, list], Sequence[Any]]


def is_var(v: Any) -> bool:
  """Whether `v` is a jaxpr variable (not a literal, not a dropped output)."""
  return isinstance(v, jcore.Var) and not isinstance(v, jcore.DropVar)


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
