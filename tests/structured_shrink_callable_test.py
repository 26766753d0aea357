"""The pruned callable and the variables shrink, against hand-sliced numpy models."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxprune.structured import make_plan, trace
from jaxprune.structured._shrink import apply as shrink
from jaxprune.structured._shrink import verify as oracle


def _group_of(graph, leaf, axis):
  return next(
    g.id for g in graph.groups if any(m.leaf == leaf and m.axis == axis for m in g.members)
  )


def _mlp():
  k = jax.random.split(jax.random.key(0), 4)
  params = {
    'w1': jax.random.normal(k[0], (3, 4)),
    'b1': jax.random.normal(k[1], (4,)),
    'w2': jax.random.normal(k[2], (4, 2)),
  }
  fn = lambda p, x: jax.nn.relu(x @ p['w1'] + p['b1']) @ p['w2']
  x = jax.random.normal(k[3], (5, 3))
  return fn, params, x, trace(fn, params, x)


def test_shrink_variables_and_pruned_fn_match_numpy_slicing():
  fn, params, x, graph = _mlp()
  hidden = _group_of(graph, 'w1', 1)
  new, pruned_fn = shrink.apply_plan(graph, params, {hidden: [1, 3]})
  w1, b1, w2 = (np.asarray(params[k]) for k in ('w1', 'b1', 'w2'))
  np.testing.assert_array_equal(new['w1'], w1[:, [0, 2]])
  np.testing.assert_array_equal(new['b1'], b1[[0, 2]])
  np.testing.assert_array_equal(new['w2'], w2[[0, 2]])
  expected = np.maximum(np.asarray(x) @ w1[:, [0, 2]] + b1[[0, 2]], 0) @ w2[[0, 2]]
  np.testing.assert_allclose(pruned_fn(new, x), expected, rtol=1e-5, atol=1e-6)
  zeroed = shrink.zero_removed(graph, params, {hidden: [1, 3]})
  zeroed = jax.tree.map(np.asarray, zeroed)
  np.testing.assert_array_equal(zeroed['w1'][:, [1, 3]], 0.0)
  np.testing.assert_array_equal(zeroed['w1'][:, [0, 2]], w1[:, [0, 2]])
  np.testing.assert_array_equal(zeroed['w2'][[1, 3]], 0.0)


def test_pruned_fn_is_differentiable_and_checks_its_inputs():
  fn, params, x, graph = _mlp()
  hidden = _group_of(graph, 'w1', 1)
  new, pruned_fn = shrink.apply_plan(graph, params, {hidden: [0]})
  grads = jax.grad(lambda v: pruned_fn(v, x).sum())(new)
  # the function is shape-generic, so autodiff of the original on the new params is a reference.
  expected = jax.grad(lambda v: fn(v, x).sum())(new)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), grads, expected)
  with pytest.raises(ValueError, match=r"leaf 'b1' has shape \(4,\), expected \(3,\)"):
    pruned_fn(params, x)
  with pytest.raises(ValueError, match='structure'):
    pruned_fn({'w1': new['w1']}, x)
  with pytest.raises(
    ValueError,
    match=r'does not run on arguments \(float32\[5, 3\], '
    r'float32\[5, 3\]\) \(tracing it again raised TypeError',
  ):
    pruned_fn(new, x, x)


def test_scan_cond_and_while_bodies_are_retraced_at_new_shapes():
  k = jax.random.split(jax.random.key(1), 5)
  v = {
    'w_in': jax.random.normal(k[0], (3, 6)),
    'w_rec': jax.random.normal(k[1], (6, 6)) / 3,
    'w_x': jax.random.normal(k[2], (3, 6)),
    'w_out': jax.random.normal(k[3], (6, 2)),
  }

  def fn(v, x):
    h = jnp.tanh(x @ v['w_in'])

    def body(c, xt):
      c = jnp.tanh(c @ v['w_rec'] + xt @ v['w_x'])
      return c, c

    c, ys = jax.lax.scan(body, h, jnp.broadcast_to(x, (3,) + x.shape) * 1.5)
    c = jax.lax.cond(x[0, 0] > 0, lambda a: a * 2, lambda a: a - 1, c)
    _, c = jax.lax.while_loop(
      lambda s: s[0] < 3, lambda s: (s[0] + 1, jnp.tanh(s[1] @ v['w_rec'])), (0, c)
    )
    return c @ v['w_out'] + ys.sum(0) @ v['w_out']

  x = jax.random.normal(k[4], (4, 3))
  graph = trace(fn, v, x)
  hidden = _group_of(graph, 'w_in', 1)
  new, pruned_fn = shrink.apply_plan(graph, v, {hidden: [0, 2, 5]})
  assert new['w_rec'].shape == (3, 3)
  # plain jnp code runs at any width: the original function on the new params is the answer.
  np.testing.assert_allclose(pruned_fn(new, x), fn(new, x), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(pruned_fn(new, -x), fn(new, -x), rtol=1e-5, atol=1e-6)


def test_slice_of_a_channel_axis_keeps_the_right_positions():
  k = jax.random.split(jax.random.key(2), 3)
  v = {'w': jax.random.normal(k[0], (3, 8)), 'w2': jax.random.normal(k[1], (5, 2))}
  fn = lambda v, x: jax.nn.relu(x @ v['w'])[:, 2:7] @ v['w2']
  x = jax.random.normal(k[2], (4, 3))
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    graph = trace(fn, v, x)
  group = _group_of(graph, 'w2', 0)
  plan = make_plan(graph, {group: [0, 3]})
  new, pruned_fn = shrink.apply_plan(graph, v, plan)
  # channels 0 and 3 of the slice are columns 2 and 5 of w.
  w, w2 = np.asarray(v['w']), np.asarray(v['w2'])
  cols = [3, 4, 6]
  expected = np.maximum(np.asarray(x) @ w[:, cols], 0) @ w2[[1, 2, 4]]
  np.testing.assert_allclose(pruned_fn(new, x), expected, rtol=1e-5, atol=1e-6)
  assert oracle.verify(graph, v, plan, x)


def test_cond_branches_with_constants_at_pruned_shapes():
  k = jax.random.split(jax.random.key(3), 3)
  v = {'w': jax.random.normal(k[0], (3, 6)), 'w2': jax.random.normal(k[1], (6, 2))}

  def fn(v, x):
    h = x @ v['w']
    # each branch broadcasts a constant to the channel axis: cut to the kept channels.
    h = jax.lax.cond(x[0, 0] > 0, lambda a: a + jnp.ones(6), lambda a: a * jnp.full(6, 3.0), h)
    return jnp.tanh(h) @ v['w2']

  x = jax.random.normal(k[2], (4, 3))
  graph = trace(fn, v, x)
  new, pruned_fn = shrink.apply_plan(graph, v, {_group_of(graph, 'w', 1): [1, 4]})
  kept = [0, 2, 3, 5]
  w, w2 = np.asarray(v['w'])[:, kept], np.asarray(v['w2'])[kept]
  for sign in (1.0, -1.0):
    xs = sign * np.asarray(x)
    h = xs @ w + 1.0 if xs[0, 0] > 0 else (xs @ w) * 3.0
    np.testing.assert_allclose(pruned_fn(new, xs), np.tanh(h) @ w2, rtol=1e-5, atol=1e-6)
