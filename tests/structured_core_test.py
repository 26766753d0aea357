"""What every structured stage uses to read jaxprs: the one traversal
(`_primitives/traversal.py`) and the one evaluator (`_core/jaxprs.py`)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jcore

from jaxprune.structured._core import jaxprs
from jaxprune.structured._primitives import traversal


def test_equations_walk_sub_jaxprs_with_how_often_each_runs_per_call():
  def fn(x):
    y = jax.lax.scan(lambda c, _: (jnp.sin(c), None), x, None, length=5)[0]
    return jax.lax.cond(x.sum() > 0, jnp.cos, jnp.tan, y)

  closed = jax.make_jaxpr(fn)(jnp.ones(3))
  rows = [
    (scope, eqn.primitive.name, times) for scope, _, eqn, times in traversal.equations(closed)
  ]
  top = [name for scope, name, _ in rows if scope == ()]
  assert top.count('scan') == 1 and top.count('cond') == 1
  scan_index = [i for i, e in enumerate(closed.jaxpr.eqns) if e.primitive.name == 'scan'][0]
  cond_index = [i for i, e in enumerate(closed.jaxpr.eqns) if e.primitive.name == 'cond'][0]
  # The scan body runs 5 times per call; each of the two branches counts 1/2.
  assert ((scan_index, 0), 'sin', 5.0) in rows
  assert {(scope, times) for scope, name, times in rows if name in ('cos', 'tan')} == {
    ((cond_index, 0), 0.5),
    ((cond_index, 1), 0.5),
  }
  # Every equation comes before the equations of its sub-jaxprs.
  assert rows.index(((), 'scan', 1.0)) < rows.index(((scan_index, 0), 'sin', 5.0))


def test_evaluate_hands_each_equation_its_operands_and_keeps_its_results():
  closed = jax.make_jaxpr(lambda x: jnp.sin(x) * 2.0)(1.0)
  seen = []

  def step(scope, index, eqn, invals):
    seen.append((scope, index, eqn.primitive.name, [float(v) for v in invals]))
    return [eqn.primitive.bind(*invals, **eqn.params)]

  out = jaxprs.evaluate(closed.jaxpr, closed.consts, [0.5], step, scope=(7,))
  assert float(out[0]) == pytest.approx(2.0 * math.sin(0.5))
  assert [(s, i, name) for s, i, name, _ in seen] == [((7,), 0, 'sin'), ((7,), 1, 'mul')]
  assert seen[1][3] == pytest.approx([math.sin(0.5), 2.0])  # the literal 2.0 read as its value


def test_call_body_is_the_body_of_a_call_and_none_otherwise():
  closed = jax.make_jaxpr(lambda x: jax.jit(jnp.tanh)(x) + 1.0)(np.ones(2, np.float32))
  call, add = closed.jaxpr.eqns
  body = traversal.call_body(call)
  assert [e.primitive.name for e in getattr(body, 'jaxpr', body).eqns] == ['tanh']
  assert traversal.call_body(add) is None


def test_with_precision_sets_every_default_product_and_keeps_the_rest():
  def fn(w, x):
    def body(c, _):  # products inside a loop and inside both branches of a cond
      return jax.lax.cond(c.sum() > 0, lambda c: jnp.tanh(c @ w), lambda c: c @ w.T, c), None

    y = jax.lax.scan(body, x, None, length=2)[0]
    kept = jnp.dot(y, w, precision=jax.lax.Precision.HIGH)  # chosen by the model: kept
    return jax.lax.conv_general_dilated(kept[None, None], w[None, None], (1, 1), 'SAME')

  w = jnp.asarray(np.random.default_rng(0).normal(size=(3, 3)), jnp.float32)
  closed = jax.make_jaxpr(fn)(w, w)
  highest = jax.lax.Precision.HIGHEST
  new = jaxprs.with_precision(closed, highest)
  precisions = [
    eqn.params['precision']
    for _, _, eqn, _ in traversal.equations(new)
    if eqn.primitive.name in ('dot_general', 'conv_general_dilated')
  ]
  high = jax.lax.Precision.HIGH
  assert sorted(precisions, key=str) == sorted([(highest, highest)] * 3 + [(high, high)], key=str)
  # The original is unchanged, the variables are the same ones, and so are the values.
  assert all(
    eqn.params['precision'] in (None, (high, high))
    for _, _, eqn, _ in traversal.equations(closed)
    if eqn.primitive.name in ('dot_general', 'conv_general_dilated')
  )
  assert new.jaxpr.invars == closed.jaxpr.invars and new.jaxpr.outvars == closed.jaxpr.outvars
  np.testing.assert_array_equal(jcore.jaxpr_as_fun(new)(w, w)[0], fn(w, w))
  assert jax.jit(jcore.jaxpr_as_fun(new)).lower(w, w).as_text().count('HIGHEST') == 6
