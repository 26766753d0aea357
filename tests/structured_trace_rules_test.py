"""Per-primitive channel rules on small plain functions, expectations by hand."""

import functools
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxprune.structured as structured
from jaxprune.structured import make_plan
from jaxprune.structured._primitives import table as primitives
from jaxprune.structured._shrink import apply as shrink
from jaxprune.structured._shrink import verify as oracle


def ones(*shape):
  return np.ones(shape, np.float32)


def parts(graph, leaf, axis):
  """{group id: indices as lists} for one leaf axis."""
  return {p.group_id: p.indices.tolist() for p in graph.leaf_axes[leaf].get(axis, [])}


def trace(fn, params, *args):
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    return structured.trace(fn, params, *args)


def test_nhwc_flatten_is_a_strided_derived_axis():
  # channel c of (1, 2, 2, 3) sits at flat positions (h*2 + w)*3 + c.
  params = {'w1': ones(4, 3), 'w2': ones(12, 5)}
  graph = trace(lambda p, x: (x @ p['w1']).reshape(1, 12) @ p['w2'], params, ones(1, 2, 2, 4))
  channels = graph.leaf_axes['w1'][1][0].group_id
  assert parts(graph, 'w2', 0)[channels] == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]
  assert graph.groups[channels].prunable
  others = [g for g in parts(graph, 'w2', 0) if g != channels]
  assert all(graph.groups[g].reason.startswith('reaches model input 0 axis') for g in others)


def test_heads_times_head_dim_merge_and_kept_positions():
  params = {'wq': ones(6, 2, 3), 'wo': ones(6, 5)}
  fn = lambda p, x: jnp.einsum('bd,dhk->bhk', x, p['wq']).reshape(2, 6) @ p['wo']
  graph = trace(fn, params, ones(2, 6))
  heads = graph.leaf_axes['wq'][1][0].group_id
  dims = graph.leaf_axes['wq'][2][0].group_id
  merged = parts(graph, 'wo', 0)
  assert merged == {heads: [[0, 1, 2], [3, 4, 5]], dims: [[0, 3], [1, 4], [2, 5]]}
  axis_parts = graph.leaf_axes['wo'][0]
  np.testing.assert_array_equal(graph.kept_positions(axis_parts, 6, {heads: [1]}), [0, 1, 2])
  np.testing.assert_array_equal(
    graph.kept_positions(axis_parts, 6, {heads: [1], dims: [0]}), [1, 2]
  )
  assert graph.new_shape((6, 5), graph.leaf_axes['wo'], {heads: [1], dims: [0]}) == (2, 5)
  assert graph.new_shape((6, 2, 3), graph.leaf_axes['wq'], {dims: [0, 2]}) == (6, 2, 1)


def test_flatten_then_unflatten_ties_the_factors_back():
  params = {'c': ones(3, 4), 'b': ones(3), 'w': ones(3, 4, 5)}

  def fn(p, x):
    h = (x[:, None, None] * p['c']).reshape(2, 12).reshape(2, 3, 4) * p['b'][:, None]
    return jnp.einsum('nij,ijk->nk', h, p['w'])

  graph = trace(fn, params, ones(2))
  rows = graph.groups[graph.leaf_axes['c'][0][0].group_id]
  assert {(m.leaf, m.axis) for m in rows.members} == {('c', 0), ('b', 0), ('w', 0)}
  cols = graph.groups[graph.leaf_axes['c'][1][0].group_id]
  assert {(m.leaf, m.axis) for m in cols.members} == {('c', 1), ('w', 1)}
  assert rows.prunable and cols.prunable


def test_slice_joins_the_kept_range_and_blocks_a_picked_position():
  params = {'w1': ones(5, 8), 'w2': ones(4, 3)}
  graph = trace(lambda p, x: h_slice(x @ p['w1']) @ p['w2'], params, ones(2, 5))
  by_rows = {tuple(map(tuple, v)): g for g, v in parts(graph, 'w1', 1).items()}
  middle = graph.groups[by_rows[((2,), (3,), (4,), (5,))]]
  assert {(m.leaf, m.axis) for m in middle.members} == {('w1', 1), ('w2', 0)}
  assert middle.prunable
  picked = graph.groups[by_rows[((0,),)]]
  assert picked.reason == "position picked by 'slice'"
  # Columns 1, 6, 7 feed nothing: removing them is free.
  unused = graph.groups[by_rows[((1,), (6,), (7,))]]
  assert unused.prunable and unused.flops_per_channel == 2 * 2 * 5


def h_slice(h):
  return h[:, 2:6] + h[:, :1]


def test_pad_offsets_positions():
  params = {'w1': ones(5, 4), 'w2': ones(7, 3)}
  fn = lambda p, x: jnp.pad(x @ p['w1'], ((0, 0), (1, 2))) @ p['w2']
  graph = trace(fn, params, ones(2, 5))
  channels = graph.leaf_axes['w1'][1][0].group_id
  assert parts(graph, 'w2', 0)[channels] == [[1], [2], [3], [4]]


def test_shared_sub_jaxpr_gets_separate_ids_per_call_site():
  params = {'a': ones(5, 8), 'b': ones(8, 3), 'c': ones(5, 8), 'd': ones(8, 3)}
  relu = jax.jit(jax.nn.relu)
  fn = lambda p, x: relu(x @ p['a']) @ p['b'] + relu(x @ p['c']) @ p['d']
  graph = trace(fn, params, ones(2, 5))
  first = graph.groups[graph.leaf_axes['a'][1][0].group_id]
  second = graph.groups[graph.leaf_axes['c'][1][0].group_id]
  assert {(m.leaf, m.axis) for m in first.members} == {('a', 1), ('b', 0)}
  assert {(m.leaf, m.axis) for m in second.members} == {('c', 1), ('d', 0)}


def test_reduction_over_channels_blocks_them():
  params = {'w1': ones(5, 8), 'w2': ones(8, 3)}
  fn = lambda p, x: (x @ p['w1'] - jnp.mean(x @ p['w1'], -1, keepdims=True)) @ p['w2']
  graph = trace(fn, params, ones(2, 5))
  group = graph.groups[graph.leaf_axes['w1'][1][0].group_id]
  assert group.reason == "reduced over by 'reduce_sum'"


@pytest.mark.parametrize(
  'op, name',
  [(lambda h: jnp.cumsum(h, axis=-1), 'cumsum'), (lambda h: jnp.sort(h, axis=-1), 'sort')],
)
def test_position_mixing_primitives_block_their_axis(op, name):
  params = {'w1': ones(5, 8), 'w2': ones(8, 3)}
  graph = trace(lambda p, x: op(x @ p['w1']) @ p['w2'], params, ones(2, 5))
  group = graph.groups[graph.leaf_axes['w1'][1][0].group_id]
  assert group.reason == f"blocked by primitive '{name}'"
  assert graph.blocked_primitives == {name: 2}  # the axis, in its input and its output


def test_full_dynamic_slice_passes_channels_through():
  params = {'w1': ones(5, 8), 'w2': ones(8, 3)}
  fn = lambda p, x: jax.lax.dynamic_slice_in_dim(x @ p['w1'], 1, 1, axis=0) @ p['w2']
  graph = trace(fn, params, ones(2, 5))
  group = graph.groups[graph.leaf_axes['w1'][1][0].group_id]
  assert {(m.leaf, m.axis) for m in group.members} == {('w1', 1), ('w2', 0)}
  assert group.prunable


def test_constants_tie_nothing_and_are_cut_per_use():
  offset = np.arange(8.0, dtype=np.float32)  # captured: one constvar used by two layers
  k = jax.random.split(jax.random.key(0), 5)
  params = {
    'a1': jax.random.normal(k[0], (5, 8)),
    'a2': jax.random.normal(k[1], (8, 3)),
    'b1': jax.random.normal(k[2], (5, 8)),
    'b2': jax.random.normal(k[3], (8, 3)),
  }

  def fn(p, x):
    # computed from no variable and no input: a (layers, channels) constant,
    # each layer using its own row (as Hugging Face's per-layer head masks).
    mask = jnp.ones((2, 8)) * jnp.arange(1.0, 3.0)[:, None]
    h1 = (x @ p['a1'] + offset) * mask[0]
    h2 = (x @ p['b1'] + offset) * mask[1]
    return h1 @ p['a2'] + h2 @ p['b2']

  x = jax.random.normal(k[4], (2, 5))
  graph = trace(fn, params, x)
  first = graph.groups[graph.leaf_axes['a1'][1][0].group_id]
  second = graph.groups[graph.leaf_axes['b1'][1][0].group_id]
  assert {(m.leaf, m.axis) for m in first.members} == {('a1', 1), ('a2', 0)}
  assert {(m.leaf, m.axis) for m in second.members} == {('b1', 1), ('b2', 0)}
  assert first.prunable and second.prunable
  plan = make_plan(graph, {first.id: [1, 6], second.id: [0]})
  new, pruned_fn = shrink.apply_plan(graph, params, plan)
  a, b = [0, 2, 3, 4, 5, 7], list(range(1, 8))
  p = {name: np.asarray(v) for name, v in params.items()}
  xs = np.asarray(x)
  expected = ((xs @ p['a1'][:, a] + offset[a]) * 1.0) @ p['a2'][a] + (
    (xs @ p['b1'][:, b] + offset[b]) * 2.0
  ) @ p['b2'][b]
  np.testing.assert_allclose(pruned_fn(new, x), expected, rtol=1e-5, atol=1e-5)
  assert oracle.verify(graph, params, plan, x)


class _GroupNormThenTranspose(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.GroupNorm(num_groups=2, name='gn')(nn.Conv(8, (1, 1), name='conv')(x))
    x = nn.ConvTranspose(4, (2, 2), strides=(2, 2), name='up')(x)
    return nn.Dense(3, name='head')(x.mean((1, 2)))


def test_group_norm_keeps_whole_norm_groups_and_conv_transpose_maps_features():
  model = _GroupNormThenTranspose()
  x = ones(1, 2, 2, 4)
  variables = jax.tree.map(
    lambda s: ones(*s.shape), jax.eval_shape(model.init, jax.random.key(0), x)
  )
  graph = trace(model.apply, variables, x)
  conv_out = {
    tuple(map(tuple, v)): graph.groups[g] for g, v in parts(graph, 'params/conv/kernel', 3).items()
  }
  # GroupNorm(2) on 8 channels: statistics per half, so a whole half may go,
  # but one channel of every half may not (it changes the halves' means).
  whole = conv_out[((0, 1, 2, 3), (4, 5, 6, 7))]
  assert whole.prunable
  assert {(m.leaf, m.axis) for m in whole.members} == {
    ('params/conv/kernel', 3),
    ('params/conv/bias', 0),
    ('params/gn/scale', 0),
    ('params/gn/bias', 0),
    ('params/up/kernel', 2),
  }
  assert conv_out[((0, 4), (1, 5), (2, 6), (3, 7))].reason == "reduced over by 'reduce_sum'"
  up = graph.groups[graph.leaf_axes['params/up/kernel'][3][0].group_id]
  assert {(m.leaf, m.axis) for m in up.members} == {
    ('params/up/kernel', 3),
    ('params/up/bias', 0),
    ('params/head/kernel', 0),
  }


def test_register_rule_validates_its_arguments():
  with pytest.raises(TypeError, match='primitive_name'):
    structured.register_rule('', structured.elementwise)
  with pytest.raises(TypeError, match='must be callable'):
    structured.register_rule('x', 'not a rule')


def test_a_rule_joining_unequal_lengths_is_an_error(monkeypatch):
  monkeypatch.setattr(primitives, 'TABLE', dict(primitives.TABLE))

  def bad_rule(ctx, eqn):
    ctx.join(ctx.ids(eqn.invars[0], 1), ctx.ids(eqn.invars[0], 1)[:2])

  structured.register_rule('tanh', bad_rule)
  with pytest.raises(ValueError, match="rule for 'tanh' joined 8 ids with 2"):
    structured.trace(lambda p, x: jnp.tanh(x @ p['w']), {'w': ones(5, 8)}, ones(2, 5))


class _Dropout(nn.Module):
  @nn.compact
  def __call__(self, x, train):
    x = nn.Dropout(0.5, deterministic=not train)(nn.relu(nn.Dense(8, name='fc1')(x)))
    return nn.Dense(3, name='fc2')(x)


def test_dropout_in_train_mode_does_not_block():
  model = _Dropout()
  variables = {
    'params': {
      'fc1': {'kernel': ones(5, 8), 'bias': ones(8)},
      'fc2': {'kernel': ones(8, 3), 'bias': ones(3)},
    }
  }
  graph = trace(
    functools.partial(model.apply, train=True, rngs={'dropout': jax.random.key(1)}),
    variables,
    ones(2, 5),
  )
  group = graph.groups[graph.leaf_axes['params/fc1/kernel'][1][0].group_id]
  assert {(m.leaf, m.axis) for m in group.members} == {
    ('params/fc1/kernel', 1),
    ('params/fc1/bias', 0),
    ('params/fc2/kernel', 0),
  }
  assert group.prunable and graph.blocked_primitives == {}


def test_tile_copies_stack_and_composite():
  params = {'w1': ones(5, 8), 'w2': ones(16, 3), 'w3': ones(8, 3)}
  double = jax.lax.composite(lambda h: h * 2.0, name='zoo.double')

  def fn(p, x):
    h = double(x @ p['w1'])
    return jnp.tile(h, (1, 2)) @ p['w2'] + jnp.stack([h, h]).sum(0) @ p['w3']

  graph = trace(fn, params, ones(2, 5))
  channels = graph.leaf_axes['w1'][1][0].group_id
  # tile (1, 2): channel c sits at c and 8 + c of the tiled axis.
  assert parts(graph, 'w2', 0) == {channels: [[c, 8 + c] for c in range(8)]}
  assert parts(graph, 'w3', 0) == {channels: [[c] for c in range(8)]}
  assert graph.groups[channels].prunable
  assert "axis made by 'stack': 1" in graph.summary()


def test_a_gather_with_a_constant_start_is_a_slice():
  # what jnp turns x[:, 2:6] into when a shape is symbolic (jax.export).
  k = jax.random.split(jax.random.key(5), 3)
  params = {'w1': jax.random.normal(k[0], (5, 8)), 'w2': jax.random.normal(k[1], (4, 3))}
  dnums = jax.lax.GatherDimensionNumbers(
    offset_dims=(0, 1), collapsed_slice_dims=(), start_index_map=(1,)
  )

  def fn(p, x):
    h = jnp.tanh(x @ p['w1'])
    return jax.lax.gather(h, jnp.array([2]), dnums, (2, 4), mode='promise_in_bounds') @ p['w2']

  x = jax.random.normal(k[2], (2, 5))
  graph = trace(fn, params, x)
  by_rows = {tuple(map(tuple, v)): g for g, v in parts(graph, 'w1', 1).items()}
  middle = graph.groups[by_rows[((2,), (3,), (4,), (5,))]]
  assert {(m.leaf, m.axis) for m in middle.members} == {('w1', 1), ('w2', 0)}
  assert middle.prunable
  plan = make_plan(graph, {middle.id: [1]})  # column 3 of w1, row 1 of w2
  new, pruned_fn = shrink.apply_plan(graph, params, plan)
  w1, w2 = np.asarray(params['w1']), np.asarray(params['w2'])
  expected = np.tanh(np.asarray(x) @ w1[:, [2, 4, 5]]) @ w2[[0, 2, 3]]
  np.testing.assert_allclose(pruned_fn(new, x), expected, rtol=1e-5, atol=1e-5)
