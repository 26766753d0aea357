"""The deploy path: the pruned callable at any input shape, exported with a
symbolic batch, serialised and run in a fresh process; plans across traces."""

import os
import subprocess
import sys
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import structured_zoo as zoo

import jaxprune.structured as jps
from jaxprune.structured._shrink import verify as oracle


def _traced(name, batch=None):
  fn, variables, args, _ = zoo.ZOO[name]()
  if batch is not None:
    args = jax.tree.map(lambda a: _rows(a, batch), args)
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    return fn, variables, args, jps.trace(fn, variables, *args)


def _rows(a, n):
  """`n` rows made from the example's rows (repeated, then scaled so they differ)."""
  a = np.asarray(a)
  reps = np.concatenate([a] * (n // len(a) + 1))[:n]
  if np.issubdtype(a.dtype, np.floating):
    reps = reps * (1.0 + 0.1 * np.arange(n)).reshape((n,) + (1,) * (a.ndim - 1))
  return jnp.asarray(reps.astype(a.dtype))


def _reference(fn, graph, variables, plan, *args):
  """The original function, at any shape, on the dense variables with the
  removed channels zeroed; returned state cut to the kept channels."""
  out = fn(jps.zero_removed(graph, variables, plan), *args)
  if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
    out = (out[0], jps.shrink_variables(graph, out[1], plan))
  return out


@pytest.mark.slow
@pytest.mark.parametrize(
  'name',
  [
    'resnet_projection',
    'cnn_bn_train',
    'transformer_block',
    'scanned_layers',
    'embedding',
    'control_flow',
  ],
)
def test_pruned_callable_runs_at_other_batch_sizes(name):
  fn, variables, args, graph = _traced(name)
  plan = jps.select(graph, variables, ratio=0.5)
  new, pruned_fn = jps.apply_plan(graph, variables, plan)
  for batch in (1, 5):
    other = jax.tree.map(lambda a, batch=batch: _rows(a, batch), args)
    out = pruned_fn(new, *other)
    report = oracle.compare(_reference(fn, graph, variables, plan, *other), out)
    assert report.ok, (name, batch, report)
    assert jax.tree.leaves(out)[0].shape[0] == batch


def test_pruned_callable_runs_at_another_sequence_length():
  fn, variables, (x,), graph = _traced('transformer_block')  # (2, 5, 6)
  plan = jps.select(graph, variables, ratio=0.5)
  new, pruned_fn = jps.apply_plan(graph, variables, plan)
  longer = jnp.concatenate([x, 0.5 * x], axis=1)[:, :9]
  assert pruned_fn(new, longer).shape == (2, 9, 6)
  assert oracle.compare(_reference(fn, graph, variables, plan, longer), pruned_fn(new, longer))


@pytest.mark.slow
def test_pruned_callable_is_differentiable_at_another_batch():
  k = jax.random.split(jax.random.key(0), 4)
  params = {
    'w1': jax.random.normal(k[0], (3, 6)),
    'b1': jax.random.normal(k[1], (6,)),
    'w2': jax.random.normal(k[2], (6, 2)),
  }
  fn = lambda p, x: jnp.tanh(x @ p['w1'] + p['b1']) @ p['w2']
  graph = jps.trace(fn, params, jnp.ones((4, 3)))
  new, pruned_fn = jps.apply_plan(graph, params, jps.select(graph, params, ratio=0.5))
  x = jax.random.normal(k[3], (7, 3))
  grads = jax.grad(lambda v: pruned_fn(v, x).sum())(new)
  # plain jnp code runs at any width, so autodiff of fn on the pruned params is a reference.
  expected = jax.grad(lambda v: fn(v, x).sum())(new)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), grads, expected)


_RELOAD = """
import sys
import jax
import numpy as np
exported = jax.export.deserialize(bytearray(open(sys.argv[1], 'rb').read()))
variables = dict(np.load(sys.argv[2]))
for batch in (1, 4):
  x = np.load(sys.argv[3])[:batch]
  np.save(f'{sys.argv[4]}_{batch}.npy', np.asarray(exported.call(variables, x)))
print(sorted(m.split('.')[0] for m in sys.modules if m.startswith(('jaxprune', 'flax'))))
"""


@pytest.mark.slow
def test_export_with_a_symbolic_batch_serialise_and_run_in_a_fresh_process(tmp_path):
  k = jax.random.split(jax.random.key(1), 4)
  params = {'w1': jax.random.normal(k[0], (3, 3, 3, 8)), 'w2': jax.random.normal(k[1], (8, 5))}

  def fn(p, x):
    h = jax.lax.conv_general_dilated(
      x, p['w1'], (1, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC')
    )
    return jax.nn.relu(h).mean((1, 2)) @ p['w2']

  graph = jps.trace(fn, params, jnp.ones((2, 6, 6, 3)))
  plan = jps.make_plan(graph, {graph.leaf_axes['w1'][3][0].group_id: [0, 3, 4]})
  new, pruned_fn = jps.apply_plan(graph, params, plan)
  (b,) = jax.export.symbolic_shape('b')
  exported = jax.export.export(pruned_fn)(
    jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), new),
    jax.ShapeDtypeStruct((b, 6, 6, 3), jnp.float32),
  )
  assert str(exported.in_avals[-1].shape) == '(b, 6, 6, 3)'
  (tmp_path / 'model.bin').write_bytes(exported.serialize())
  np.savez(tmp_path / 'variables.npz', **{k: np.asarray(v) for k, v in new.items()})
  x = np.asarray(jax.random.normal(k[2], (4, 6, 6, 3)))
  np.save(tmp_path / 'x.npy', x)
  run = subprocess.run(
    [
      sys.executable,
      '-c',
      _RELOAD,
      str(tmp_path / 'model.bin'),
      str(tmp_path / 'variables.npz'),
      str(tmp_path / 'x.npy'),
      str(tmp_path / 'out'),
    ],
    env=dict(os.environ, JAX_PLATFORMS='cpu'),
    capture_output=True,
    text=True,
    check=True,
    timeout=120,
  )
  assert run.stdout.strip() == '[]'  # neither jaxprune nor flax in the fresh process
  kept = [1, 2, 5, 6, 7]
  w1, w2 = np.asarray(params['w1'])[..., kept], np.asarray(params['w2'])[kept]
  for batch in (1, 4):
    h = jax.lax.conv_general_dilated(
      x[:batch], w1, (1, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC')
    )
    expected = np.maximum(np.asarray(h), 0).mean((1, 2)) @ w2
    np.testing.assert_allclose(
      np.load(tmp_path / f'out_{batch}.npy'), expected, rtol=1e-5, atol=1e-5
    )


def _positional():
  """Learned positions sliced to the sequence length, then a 4-8-2 MLP per token."""
  k = jax.random.split(jax.random.key(2), 4)
  params = {
    'pos': jax.random.normal(k[0], (6, 4)),
    'w1': jax.random.normal(k[1], (4, 8)),
    'w2': jax.random.normal(k[2], (8, 2)),
  }
  fn = lambda p, x: jax.nn.relu((x + p['pos'][: x.shape[1]]) @ p['w1']) @ p['w2']
  return fn, params, jax.random.normal(k[3], (2, 6, 4))


def test_a_plan_made_on_one_trace_applies_to_a_trace_at_another_length():
  fn, params, x = _positional()
  graph = jps.trace(fn, params, x)
  short = jps.trace(fn, params, x[:, :4])
  # At length 4, positions 4 and 5 are read by no one: a group of their own,
  # numbered before the hidden layer, whose id therefore differs.
  hidden = graph.leaf_axes['w1'][1][0].group_id
  assert short.leaf_axes['w1'][1][0].group_id != hidden
  plan = jps.make_plan(graph, {hidden: [1, 2, 6]})
  new, pruned_fn = jps.apply_plan(graph, params, plan)
  new_short, _ = jps.apply_plan(short, params, plan)
  jax.tree.map(np.testing.assert_array_equal, new, new_short)
  assert new['w1'].shape == (4, 5)
  for length in (4, 6, 1):
    xs = x[:, :length]
    assert oracle.compare(_reference(fn, graph, params, plan, xs), pruned_fn(new, xs))
  # positions 4 and 5 are not read at length 4: removing them would save
  # nothing (and break length 6), so they are not prunable.
  rows = short.groups[short.leaf_axes['pos'][0][-1].group_id]
  assert rows.members[0].indices.ravel().tolist() == [4, 5]
  assert rows.reason == 'never read by the traced function'


def test_channels_map_by_identity_not_by_index():
  # fc1 (10 -> 16) and fc2 (16 -> 8): removing channels [0, 1] of the 8-wide
  # group made on one trace removes the same fc2 columns on the other.
  fn, variables, args, graph = _traced('mlp')
  _, _, _, graph1 = _traced('mlp', batch=1)
  group = next(g for g in graph.prunable_groups if g.size == 8)
  plan = jps.make_plan(graph, {group.id: [0, 1]})
  translated = jps.plan_for(graph1, plan)
  group1 = next(g for g in graph1.prunable_groups if g.size == 8)
  assert dict(translated.removed).keys() == {group1.id}
  np.testing.assert_array_equal(translated.removed[group1.id], [0, 1])
  np.testing.assert_array_equal(
    jps.shrink_variables(graph1, variables, plan)['params']['fc2']['kernel'],
    np.asarray(variables['params']['fc2']['kernel'])[:, 2:],
  )


def test_a_group_another_trace_ties_differently_is_an_error_not_a_swap():
  params = {
    'w1': np.ones((5, 8), np.float32),
    'w2': np.ones((8, 3), np.float32),
    'w3': np.ones((5, 8), np.float32),
    'w4': np.ones((8, 3), np.float32),
  }
  x = np.ones((2, 5), np.float32)
  separate = lambda p, x: (x @ p['w1']) @ p['w2'] + (x @ p['w3']) @ p['w4']
  tied = lambda p, x: (x @ p['w1'] + x @ p['w3']) @ p['w2'] + (x @ p['w3']) @ p['w4']
  graph = jps.trace(separate, params, x)
  first = graph.leaf_axes['w1'][1][0].group_id
  plan = jps.make_plan(graph, {first: [0]})
  other = jps.trace(tied, params, x)
  # Two 8-channel groups in both graphs, but w1's channels are tied to w3's in the other.
  assert sorted(g.size for g in other.prunable_groups) == [8]
  with pytest.raises(
    ValueError,
    match=r'group \d+ \(w1:1 \(\+1 members\), 8 channels\) is not '
    'a group of this trace',
  ):
    jps.apply_plan(other, params, plan)
  # a plan without group identity only applies to a graph with the same groups.
  bare = jps.Plan({first: np.array([0])}, {first: 5})
  with pytest.raises(ValueError, match='channels in the plan'):
    jps.apply_plan(graph, params, bare)


def test_export_at_a_symbolic_batch_keeps_slices_jnp_turns_into_gathers():
  k = jax.random.split(jax.random.key(3), 3)
  params = {'w1': jax.random.normal(k[0], (5, 8)), 'w2': jax.random.normal(k[1], (4, 3))}
  fn = lambda p, x: jnp.tanh(x @ p['w1'])[..., 2:6] @ p['w2']
  graph = jps.trace(fn, params, jnp.ones((2, 5)))
  middle = graph.leaf_axes['w2'][0][0].group_id  # columns 2..5 of w1 (0, 1, 6, 7 are unused)
  plan = jps.make_plan(graph, {middle: [0, 3]})  # columns 2 and 5 of w1
  new, pruned_fn = jps.apply_plan(graph, params, plan)
  (b,) = jax.export.symbolic_shape('b')
  exported = jax.export.export(pruned_fn)(
    jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), new),
    jax.ShapeDtypeStruct((b, 5), jnp.float32),
  )
  x = np.asarray(jax.random.normal(k[2], (3, 5)))
  w1, w2 = np.asarray(params['w1']), np.asarray(params['w2'])
  np.testing.assert_allclose(
    exported.call(new, x), np.tanh(x @ w1[:, [3, 4]]) @ w2[[1, 2]], rtol=1e-5, atol=1e-5
  )


class _LSTMText(nn.Module):
  """Embedding -> `nn.RNN(nn.LSTMCell)` (a `lax.scan` over the tokens) -> Dense."""

  @nn.compact
  def __call__(self, ids):
    return nn.Dense(3)(nn.RNN(nn.LSTMCell(12))(nn.Embed(20, 8)(ids))[:, -1])


@pytest.mark.slow
def test_scanned_model_exports_with_symbolic_batch_and_length():
  model = _LSTMText()
  ids = jnp.arange(10, dtype=jnp.int32).reshape(2, 5)
  variables = model.init(jax.random.key(0), ids)
  graph = jps.trace(model.apply, variables, ids)
  plan = jps.select(
    graph, variables, ratio={'recurrent': 0.25}, constraint=jps.Constraint(round_to=1)
  )
  (removed,) = [r for r in plan.removed.values() if len(r)]
  assert len(removed) == 3
  new_variables, pruned_fn = jps.apply_plan(graph, variables, plan)
  b, t = jax.export.symbolic_shape('b, t')
  exported = jax.export.export(pruned_fn)(new_variables, jax.ShapeDtypeStruct((b, t), jnp.int32))
  exported = jax.export.deserialize(exported.serialize())
  # By hand: a hidden unit whose weights are all zero has every gate at 0.5 and
  # tanh(0) = 0 as its candidate, so its cell and output stay 0: the dense model
  # with those units zeroed.
  zeroed = jax.tree.map(np.array, variables)
  cell = zeroed['params']['LSTMCell_0']
  for name, leaves in cell.items():
    leaves['kernel'][..., removed] = 0
    if name.startswith('h'):
      leaves['kernel'][removed] = 0
      leaves['bias'][removed] = 0
  zeroed['params']['Dense_0']['kernel'][removed] = 0
  for shape in ((3, 7), (1, 2)):
    x = jnp.arange(np.prod(shape), dtype=jnp.int32).reshape(shape) % 20
    np.testing.assert_allclose(
      exported.call(new_variables, x), model.apply(zeroed, x), rtol=1e-5, atol=1e-6
    )
