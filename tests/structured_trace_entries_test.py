"""Unread variables and several entry points (eval and train) in one graph."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxprune.structured as jps


def _variables():
  rng = np.random.default_rng(0)
  return {
    'params': {
      'w1': rng.normal(size=(5, 8)).astype(np.float32),
      'w2': rng.normal(size=(8, 3)).astype(np.float32),
    },
    'stats': {'ema': np.abs(rng.normal(size=(8,))).astype(np.float32) + 0.5},
  }


def evaluate(v, x):
  """Eval mode: the running average is not used."""
  return jax.nn.relu(x @ v['params']['w1']) @ v['params']['w2']


def evaluate_with_state(v, x):
  """Eval mode that hands its state back unchanged (as NNX and Linen mutable do)."""
  return evaluate(v, x), {'stats': {'ema': v['stats']['ema']}}


def train(v, x):
  """Train mode: normalise by the batch, update the running average of |h|."""
  h = jax.nn.relu(x @ v['params']['w1'])
  ema = 0.9 * v['stats']['ema'] + 0.1 * jnp.abs(h).mean(0)
  return h @ v['params']['w2'], {'stats': {'ema': ema}}


X = np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5)


@pytest.mark.parametrize('fn', [evaluate, evaluate_with_state])
def test_a_variable_the_function_never_reads_is_not_prunable(fn):
  variables = _variables()
  graph = jps.trace(fn, variables, X)
  assert graph.unread == ['stats/ema']
  ema = graph.groups[graph.leaf_axes['stats/ema'][0][0].group_id]
  assert ema.reason == 'never read by the traced function' and not ema.prunable
  assert [g.size for g in graph.prunable_groups] == [8]
  assert 'unread variables: stats/ema' in graph.summary()
  # a global selection spends its budget on real channels.
  plan = jps.select(
    graph, variables, ratio=0.5, scope='global', constraint=jps.Constraint(round_to=1)
  )
  assert jps.plan_flops(graph, plan) < graph.total_flops


def test_train_entry_point_ties_the_running_average_to_its_channels():
  variables = _variables()
  graph = jps.trace(evaluate, variables, X, also=[(train, (X,))])
  assert graph.unread == [] and len(graph.entries) == 2
  hidden = graph.groups[graph.leaf_axes['params/w1'][1][0].group_id]
  assert {(m.leaf, m.axis) for m in hidden.members} == {
    ('params/w1', 1),
    ('params/w2', 0),
    ('stats/ema', 0),
  }
  assert [g.size for g in graph.prunable_groups] == [8]
  # FLOPs are those of the first entry point: 2*2*5*8 + 2*2*8*3.
  assert graph.total_flops == 160 + 96
  plan = jps.make_plan(graph, {hidden.id: [0, 5]})
  new, pruned_eval = jps.apply_plan(graph, variables, plan)
  kept = [1, 2, 3, 4, 6, 7]
  np.testing.assert_array_equal(new['stats']['ema'], variables['stats']['ema'][kept])
  pruned_train = jps.pruned_callable(graph, plan, entry=1)
  w1, w2 = variables['params']['w1'][:, kept], variables['params']['w2'][kept]
  h = np.maximum(X @ w1, 0)
  out, state = pruned_train(new, X)
  np.testing.assert_allclose(out, h @ w2, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
    state['stats']['ema'], 0.9 * new['stats']['ema'] + 0.1 * h.mean(0), rtol=1e-5
  )
  np.testing.assert_allclose(pruned_eval(new, X[:1]), h[:1] @ w2, rtol=1e-5, atol=1e-5)
  # the train entry point also runs at another batch size.
  assert pruned_train(new, np.concatenate([X, X]))[0].shape == (4, 3)


def test_entry_points_are_checked():
  variables = _variables()
  with pytest.raises(TypeError, match=r'also\[0\]: give \(fn, args\)'):
    jps.trace(evaluate, variables, X, also=[train])
  with pytest.raises(TypeError, match=r'also\[0\]: the second element must be a tuple'):
    jps.trace(evaluate, variables, X, also=[(train, X)])
  graph = jps.trace(evaluate, variables, X)
  with pytest.raises(ValueError, match=r'entry=1: the graph has 1 entry point'):
    jps.pruned_callable(graph, {}, entry=1)
