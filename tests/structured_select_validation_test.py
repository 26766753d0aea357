"""The structured API refuses what it cannot honour with a ValueError or
TypeError naming the field, the value and the fix, before any work."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxprune.structured as jps


class MLP(nn.Module):
  hidden: int = 16

  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(nn.relu(nn.Dense(self.hidden)(x)))


@pytest.fixture(scope='module')
def traced():
  x = jnp.ones((2, 4))
  variables = MLP().init(jax.random.key(0), x)
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    graph = jps.trace(MLP().apply, variables, x)
  (hidden,) = graph.prunable_groups
  return graph, variables, hidden


def test_select_and_apply_plan_refuse_variables_of_other_shapes(traced):
  graph, _, hidden = traced
  other = MLP(hidden=8).init(jax.random.key(0), jnp.ones((2, 4)))
  # Dense_0 is the output layer (made first), Dense_1 the hidden one.
  with pytest.raises(
    ValueError,
    match=r"select: variables leaf 'params/Dense_0/kernel' has "
    r'shape \(8, 2\), the graph was traced with \(16, 2\)',
  ):
    jps.select(graph, other, ratio=0.5)
  plan = jps.make_plan(graph, {hidden.id: [0]})
  with pytest.raises(ValueError, match=r"apply_plan: variables leaf 'params/Dense_0/kernel'"):
    jps.apply_plan(graph, other, plan)
  with pytest.raises(ValueError, match='apply_plan: variables have structure'):
    jps.apply_plan(graph, other['params'], plan)
  with pytest.raises(ValueError, match=r"shrink_variables: leaf 'params/Dense_0/kernel'"):
    jps.shrink_variables(graph, other, plan)


def test_nan_importance_is_refused(traced):
  graph, variables, hidden = traced
  with pytest.raises(ValueError, match=rf'importance\[{hidden.id}\]: 16 of 16 scores are NaN'):
    jps.select(graph, variables, ratio=0.5, importance={hidden.id: np.full(16, np.nan)})
  nan_weights = jax.tree.map(lambda a: a * np.nan, variables)
  with pytest.raises(ValueError, match=r"NaN \(importance='l2'\).*check the variables"):
    jps.select(graph, nan_weights, ratio=0.5)


def test_hand_built_plan_with_an_out_of_range_channel(traced):
  graph, variables, hidden = traced
  plan = jps.Plan(removed={hidden.id: np.array([3, 16])}, sizes={hidden.id: 16})
  with pytest.raises(
    ValueError,
    match=rf'plan: group {hidden.id} has channels 0..15, the plan '
    r'removes \[3, 16\]',
  ):
    jps.apply_plan(graph, variables, plan)
  keyed = jps.make_plan(graph, {hidden.id: [3]})
  bad = jps.Plan({hidden.id: np.array([-1])}, keyed.sizes, keyed.keys)
  with pytest.raises(ValueError, match=r'removes \[-1\]'):
    jps.apply_plan(graph, variables, bad)


@pytest.mark.parametrize(
  'kwargs, message',
  [
    (
      {'n_channels': float('nan')},
      r'n_channels=nan: give the number of channels to remove, '
      r'an int >= 1',
    ),
    ({'n_channels': '3'}, r"n_channels='3': give the number"),
    (
      {'flops_target': '0.5'},
      r"flops_target='0.5': give the fraction of FLOPs to keep, a "
      r'number in \(0, 1\]',
    ),
    ({'flops_target': float('nan')}, r'flops_target=nan'),
  ],
)
def test_targets_name_field_value_and_fix(traced, kwargs, message):
  graph, variables, _ = traced
  with pytest.raises(ValueError, match=message):
    jps.select(graph, variables, **kwargs)


@pytest.mark.parametrize(
  'kwargs, message',
  [
    ({'round_to': 2.5}, r'Constraint\(round_to=2.5\): give an int, e.g. round_to=1'),
    ({'min_channels': 1.5}, r'Constraint\(min_channels=1.5\): give an int'),
    ({'min_ratio': '0.1'}, r"Constraint\(min_ratio='0.1'\): give a number in \[0, 1\]"),
  ],
)
def test_constraint_fields_name_field_value_and_fix(kwargs, message):
  with pytest.raises(TypeError, match=message):
    jps.Constraint(**kwargs)
