"""Every zoo model is pruned and checked against the zero-the-removed-channels oracle."""

import warnings

import jax
import numpy as np
import pytest
from structured_zoo import ZOO

from jaxprune.structured import Constraint, trace
from jaxprune.structured._select import selectors
from jaxprune.structured._shrink import apply as shrink
from jaxprune.structured._shrink import verify as oracle

# Primitives with only an eager implementation cannot be jitted, pruned or not.
_EAGER_ONLY = {'custom_primitive'}


def _traced(name):
  fn, variables, args, _ = ZOO[name]()
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    graph = trace(fn, variables, *args)
  return fn, variables, args, graph


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(ZOO))
def test_every_zoo_model_prunes_and_verifies(name):
  _, variables, args, graph = _traced(name)
  plan = selectors.select(
    graph, variables, ratio=0.5, importance='random', seed=1, constraint=Constraint(round_to=1)
  )
  if graph.prunable_groups:
    assert plan.num_removed > 0
  report = oracle.verify(graph, variables, plan, *args, per_group=True, jit=name not in _EAGER_ONLY)
  assert report.ok, (name, report)
  assert set(report.per_group) == set(plan.removed)
  # the check can fail: the same outputs differ from the dense, unzeroed model.
  if plan.num_removed and name not in _EAGER_ONLY:
    new_variables, pruned_fn = shrink.apply_plan(graph, variables, plan)
    dense = jax.core.eval_jaxpr(
      graph.closed_jaxpr.jaxpr,
      graph.closed_jaxpr.consts,
      *jax.tree_util.tree_leaves((variables, *args)),
    )
    pruned = jax.tree_util.tree_leaves(pruned_fn(new_variables, *args))
    assert any(
      a.shape != b.shape or not np.allclose(a, b, atol=1e-6)
      for a, b in zip(dense, pruned, strict=True)
    )


@pytest.mark.parametrize('name', ['resnet_projection', 'transformer_block', 'scanned_layers'])
def test_pruned_callable_exports(name):
  _, variables, args, graph = _traced(name)
  plan = selectors.select(graph, variables, ratio=0.5)
  new_variables, pruned_fn = shrink.apply_plan(graph, variables, plan)
  exported = jax.export.export(pruned_fn)(new_variables, *args)
  assert exported.in_avals[0].shape == jax.tree_util.tree_leaves(new_variables)[0].shape
  np.testing.assert_allclose(
    exported.call(new_variables, *args), pruned_fn(new_variables, *args), rtol=1e-6, atol=1e-6
  )
