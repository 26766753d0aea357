"""`scatter-add` (`x.at[i].add(v)`, and the gradient of a lookup): whole window axes pass
channels through, as in a mixture of experts' combine step, and the indexed axis blocks."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np

import jaxprune.structured as jps

TOKENS, WIDTH, HIDDEN = 6, 8, 12
# Which output row each token's result is added into (two tokens share row 1).
ROUTE = jnp.array([3, 1, 0, 1, 5, 2])


def make_params():
  keys = jax.random.split(jax.random.key(0), 2)
  return {
    'up': jax.random.normal(keys[0], (WIDTH, HIDDEN)),
    'down': jax.random.normal(keys[1], (HIDDEN, WIDTH)),
  }


def combine(params, x):
  """Each token's hidden activations added into its routed row, as a mixture of experts
  combines its experts' outputs, then projected back."""
  h = jax.nn.gelu(x @ params['up'])
  rows = jnp.zeros((TOKENS, HIDDEN), h.dtype).at[ROUTE].add(h)
  return rows @ params['down']


X = jax.random.normal(jax.random.key(1), (TOKENS, WIDTH))


def _trace(fn, params, *args):
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    return jps.trace(fn, params, *args)


def _group_of(graph, leaf, axis):
  (part,) = graph.leaf_axes[leaf][axis]
  return graph.groups[part.group_id]


def test_x_at_add_is_a_scatter_add():
  assert 'scatter-add' in str(jax.make_jaxpr(combine)(make_params(), X))


def test_the_hidden_channels_pass_through_a_scatter_add():
  params = make_params()
  graph = _trace(combine, params, X)
  hidden = _group_of(graph, 'up', 1)
  assert hidden.prunable and hidden.size == HIDDEN
  assert hidden is _group_of(graph, 'down', 0)
  removed = [0, 4, 7]
  plan = jps.make_plan(graph, {hidden.id: removed})
  new_params, pruned = jps.apply_plan(graph, params, plan)
  assert new_params['up'].shape == (WIDTH, HIDDEN - 3)
  assert new_params['down'].shape == (HIDDEN - 3, WIDTH)
  # The pruned model is the dense one with those hidden channels zeroed, by hand.
  zeroed = {'up': params['up'].at[:, removed].set(0), 'down': params['down']}
  np.testing.assert_allclose(pruned(new_params, X), combine(zeroed, X), rtol=1e-5, atol=1e-5)
  assert jps.verify(graph, params, plan, X).ok


def table_update(params, x):
  """Rows of a table picked by the route and added into: the table's rows are indexed."""
  table = params['table'].at[ROUTE].add(x @ params['proj'])
  return table @ params['out']


def test_an_axis_scattered_into_blocks_and_the_window_passes():
  keys = jax.random.split(jax.random.key(2), 3)
  params = {
    'table': jax.random.normal(keys[0], (TOKENS, HIDDEN)),
    'proj': jax.random.normal(keys[1], (WIDTH, HIDDEN)),
    'out': jax.random.normal(keys[2], (HIDDEN, 2)),
  }
  graph = _trace(table_update, params, X)
  assert not _group_of(graph, 'table', 0).prunable
  window = _group_of(graph, 'table', 1)
  assert window is _group_of(graph, 'proj', 1) and window is _group_of(graph, 'out', 0)
  assert window.prunable
  plan = jps.make_plan(graph, {window.id: [2, 3]})
  assert jps.verify(graph, params, plan, X).ok
