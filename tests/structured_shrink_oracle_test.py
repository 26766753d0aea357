"""verify's comparison: relative to each output's scale, tolerances by dtype."""

import jax
import numpy as np
import pytest

import jaxprune.structured as structured
from jaxprune.structured._primitives import traversal
from jaxprune.structured._shrink import verify as oracle


def test_a_difference_is_judged_against_the_output_scale_not_each_element():
  # 5e-3 off on an output of scale 100 (5e-5 of it) is rounding, also where an
  # element is tiny; an elementwise atol of 1e-5 would reject the second entry.
  report = oracle.compare([np.float32([100.0, 0.001])], [np.float32([100.005, 0.0015])])
  assert report.ok
  assert report.max_rel_diff == pytest.approx(5e-5, rel=1e-2)
  assert report.max_abs_diff == pytest.approx(5e-3, rel=1e-2)
  assert report.max_abs_ref == 100.0
  # 2e-4 of the scale is more than float32 rounding.
  assert not oracle.compare([np.float32([100.0, 1.0])], [np.float32([100.0, 1.02])]).ok


def test_each_output_has_its_own_scale():
  big, small = np.float32([1000.0]), np.float32([1e-3])
  report = oracle.compare((big, small), (big, small + np.float32(1e-6)))
  assert not report.ok and report.max_rel_diff == pytest.approx(1e-3, rel=1e-2)


def test_tolerance_follows_the_dtype():
  assert oracle.compare([np.float64([1.0])], [np.float64([1.0 + 1e-11])]).ok
  assert not oracle.compare([np.float64([1.0])], [np.float64([1.0 + 1e-9])]).ok
  assert oracle.compare([np.float16([1.0])], [np.float16([1.005])]).ok
  assert oracle.compare([np.int32([3, 4])], [np.int32([3, 4])]).ok
  assert not oracle.compare([np.int32([3, 4])], [np.int32([3, 5])]).ok
  assert oracle.compare([np.float32([1.0])], [np.float32([1.02])], rtol=0.05).ok


def test_nan_agrees_only_with_nan():
  assert oracle.compare([np.float32([np.nan, 1.0])], [np.float32([np.nan, 1.0])]).ok
  report = oracle.compare([np.float32([np.nan, 1.0])], [np.float32([0.0, 1.0])])
  assert not report.ok and report.max_rel_diff == float('inf')


def test_shapes_and_structures_must_match():
  assert not oracle.compare([np.ones(3)], [np.ones(4)]).ok
  with pytest.raises(ValueError, match='output structures differ'):
    oracle.compare([np.ones(3)], (np.ones(3), np.ones(3)))


def test_where_products_are_rounded_the_checks_replay_at_full_precision(monkeypatch):
  # On a GPU or TPU float32 products are rounded (TF32, bfloat16 passes) unless asked for
  # in full: the checks then replay the graph rewritten so. A CPU multiplies in full, so
  # here it stands in for a GPU.
  def mlp(params, x):
    return jax.nn.relu(x @ params['w1']) @ params['w2']

  k1, k2 = jax.random.split(jax.random.key(0))
  params = {'w1': jax.random.normal(k1, (6, 16)), 'w2': jax.random.normal(k2, (16, 3))}
  x = jax.random.normal(jax.random.key(1), (4, 6))
  graph = structured.trace(mlp, params, x)
  assert oracle.full_precision_graph(graph) is graph  # a CPU: nothing to rewrite
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  checked = oracle.full_precision_graph(graph)
  highest = (jax.lax.Precision.HIGHEST,) * 2
  assert [
    eqn.params['precision']
    for _, _, eqn, _ in traversal.equations(checked.closed_jaxpr)
    if eqn.primitive.name == 'dot_general'
  ] == [highest, highest]
  assert all(
    eqn.params['precision'] is None
    for _, _, eqn, _ in traversal.equations(graph.closed_jaxpr)
    if eqn.primitive.name == 'dot_general'
  )  # the user's graph: as traced
  result = structured.prune(mlp, x, variables=params, ratio=0.5, progress=False)
  assert result.check.ok and result.check.max_rel_diff < 1e-6
  plan = structured.select(graph, params, ratio=0.5)
  assert structured.verify(graph, params, plan, x).ok
