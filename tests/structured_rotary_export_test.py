"""Pruned models with rotary embeddings run and export at every shape the dense model does.

At a symbolic shape `jnp` writes the strided slices of interleaved rotary
embeddings (`x[..., 1::2]`, GPT-J and RoFormer) as gathers with a constant
index; the pruned callable traces the model again there, and must find the
same channel groups (a rotated pair is one channel) to apply the plan. The
rotate-half form (Llama) slices halves, which `jnp` writes as gathers too.
Expectations: the dense model with the removed channels zeroed by hand, or
positions picked by hand.
"""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import structured_trace_lookups_test as lookups
import thirdparty_zoo_hf as hf

import jaxprune.structured as jps

EXACT = jps.Constraint(round_to=1)


def _specs(tree, batch=None):
  """ShapeDtypeStructs of `tree`, the leading axis symbolic when `batch` is given."""
  lead = lambda a: (batch, *a.shape[1:]) if batch is not None else a.shape
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(lead(a), a.dtype), tree)


def test_a_gather_with_constant_positions_along_one_axis_maps_them():
  # What jnp writes for h[:, 1::2] and h[:, [0, 0, 5]] when a shape is symbolic.
  k = jax.random.split(jax.random.key(5), 4)
  params = {
    'w1': jax.random.normal(k[0], (5, 8)),
    'w2': jax.random.normal(k[1], (4, 3)),
    'w3': jax.random.normal(k[2], (3, 3)),
  }
  dnums = jax.lax.GatherDimensionNumbers(
    offset_dims=(0,), collapsed_slice_dims=(1,), start_index_map=(1,)
  )
  take = lambda h, positions: jax.lax.gather(
    h, jnp.array(positions)[:, None], dnums, (h.shape[0], 1), mode='promise_in_bounds'
  )

  def fn(p, x):
    h = jnp.tanh(x @ p['w1'])
    return take(h, [1, 3, 5, 7]) @ p['w2'] + take(h, [0, 0, 5]) @ p['w3']

  x = jax.random.normal(k[3], (2, 5))
  graph = jps.trace(fn, params, x)
  parts = lambda leaf: {tuple(map(tuple, p.indices.tolist())): p.group_id for p in leaf}
  w1, w2, w3 = (parts(graph.leaf_axes[n][0 if n != 'w1' else 1]) for n in ('w1', 'w2', 'w3'))
  # By hand: columns 1, 3, 7 of w1 are rows 0, 1, 3 of w2; column 5 is row 2 of w2 and
  # row 2 of w3; column 0, picked twice, is rows 0 and 1 of w3 (one channel); columns
  # 2, 4, 6 are read by nothing.
  assert w2 == {((0,), (1,), (3,)): w1[((1,), (3,), (7,))], ((2,),): w1[((5,),)]}
  assert w3 == {((0, 1),): w1[((0,),)], ((2,),): w1[((5,),)]}
  odd, unread = w1[((1,), (3,), (7,))], w1[((2,), (4,), (6,))]
  assert graph.groups[odd].prunable and graph.groups[unread].prunable
  plan = jps.make_plan(graph, {odd: [0], unread: [0, 1]})  # columns 1, 2 and 4 of w1
  new, pruned_fn = jps.apply_plan(graph, params, plan)
  assert new['w1'].shape == (5, 5) and new['w2'].shape == (3, 3) and new['w3'].shape == (3, 3)
  dense = {n: np.asarray(v) for n, v in params.items()}

  def expected(x):
    h = np.tanh(np.asarray(x) @ dense['w1'])
    return h[:, [3, 5, 7]] @ dense['w2'][1:] + h[:, [0, 0, 5]] @ dense['w3']

  np.testing.assert_allclose(pruned_fn(new, x), expected(x), rtol=1e-5, atol=1e-5)
  (b,) = jax.export.symbolic_shape('b')
  exported = jax.export.export(pruned_fn)(_specs(new), jax.ShapeDtypeStruct((b, 5), jnp.float32))
  x3 = jax.random.normal(k[3], (3, 5))
  np.testing.assert_allclose(exported.call(new, x3), expected(x3), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('form', ['gptj', 'roformer', 'llama'])
def test_rotary_attention_pruned_exports_with_a_symbolic_batch(form):
  x = jax.random.normal(jax.random.key(1), (2, 6, 16))
  model = lookups.RotaryAttention(form)
  variables = model.init(jax.random.key(0), x)
  result = jps.prune(model.apply, variables, x, ratio=0.5, constraint=EXACT, progress=False)
  graph, removed = result.graph, result.plan.removed
  (rotated,) = graph.leaf_axes['params/q/kernel'][2]
  gone = rotated.indices[removed[rotated.group_id]]
  assert len(gone) == 2  # two of the four rotated pairs go
  (b,) = jax.export.symbolic_shape('b')
  exported = jax.export.export(jax.jit(result.pruned_fn))(
    _specs(result.variables), jax.ShapeDtypeStruct((b, 6, 16), jnp.float32)
  )
  exported = jax.export.deserialize(exported.serialize())
  zeroed = jps.zero_removed(graph, variables, result.plan)
  # By hand too: the removed pairs' query/key kernel columns are zero.
  assert not np.asarray(zeroed['params']['q']['kernel'])[..., gone.ravel()].any()
  for batch in (1, 5):
    xb = jax.random.normal(jax.random.key(batch), (batch, 6, 16))
    expected = model.apply(zeroed, xb)
    np.testing.assert_allclose(exported.call(result.variables, xb), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
      result.pruned_fn(result.variables, xb), expected, rtol=1e-5, atol=1e-5
    )


@pytest.mark.slow
@pytest.mark.parametrize('name', ['hf_gptj', 'hf_roformer'])
def test_hugging_face_rotary_models_pruned_export_with_a_symbolic_batch(name):
  case = getattr(hf, name)()
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    result = jps.prune(
      case.fn, *case.inputs(2), variables=case.variables, ratio=0.5, progress=False
    )
  graph = result.graph
  # The rotated query/key pairs of both layers lose channels (one of GPT-J's 2 pairs, two
  # of RoFormer's 4): head_dim channels owning 2 dims of each of the 4 heads.
  pairs = [
    g
    for g in graph.prunable_groups
    if g.kind == 'head_dim'
    and g.id in result.plan.removed
    and {np.shape(m.indices)[1] for m in g.members} == {2 * 4}
  ]
  assert len(pairs) == 2, result.plan.summary()
  (b,) = jax.export.symbolic_shape('b')
  exported = jax.export.export(jax.jit(result.pruned_fn))(
    _specs(result.variables), *_specs(case.inputs(2), b)
  )
  zeroed = jps.zero_removed(graph, case.variables, result.plan)
  args = case.inputs(3)
  expected = jax.jit(case.fn)(zeroed, *args)
  scale = float(np.abs(expected).max())
  for out in (exported.call(result.variables, *args), result.pruned_fn(result.variables, *args)):
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * scale)


def test_a_group_the_plan_keeps_whole_need_not_be_a_group_of_another_trace():
  k = jax.random.split(jax.random.key(2), 4)
  params = {
    name: jax.random.normal(key, shape)
    for name, key, shape in zip(
      ('w1', 'w2', 'w3', 'w4'), k, ((5, 8), (8, 3), (5, 8), (8, 3)), strict=True
    )
  }
  x = jnp.ones((2, 5))
  plain = lambda p, x: (x @ p['w1']) @ p['w2'] + (x @ p['w3']) @ p['w4']
  # The same function but for a sort over w3's channels: no group of that trace can lose
  # them.
  sorted_ = lambda p, x: (x @ p['w1']) @ p['w2'] + jnp.sort(x @ p['w3'], -1) @ p['w4']
  graph, other = jps.trace(plain, params, x), jps.trace(sorted_, params, x)
  first, second = (graph.leaf_axes[name][1][0].group_id for name in ('w1', 'w3'))
  plan = jps.make_plan(graph, {first: [0], second: [1]})
  with pytest.raises(ValueError, match=r'group \d+ \(w3:1 \(\+1 members\), 8 channels\) is not'):
    jps.plan_for(other, plan)
  keeps_second = dataclasses.replace(plan, removed={first: [0], second: np.zeros(0, int)})
  translated = jps.plan_for(other, keeps_second)
  (only,) = translated.removed
  assert {(m.leaf, m.axis) for m in other.groups[only].members} == {('w1', 1), ('w2', 0)}
  new, pruned_fn = jps.apply_plan(other, params, keeps_second)
  assert new['w1'].shape == (5, 7) and new['w3'].shape == (5, 8)
  w = {n: np.asarray(v) for n, v in params.items()}
  expected = (np.asarray(x) @ w['w1'][:, 1:]) @ w['w2'][1:] + np.sort(
    np.asarray(x) @ w['w3'], -1
  ) @ w['w4']
  np.testing.assert_allclose(pruned_fn(new, x), expected, rtol=1e-5, atol=1e-5)
