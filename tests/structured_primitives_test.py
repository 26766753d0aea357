"""The primitives table: one entry per primitive, sub-jaxprs and FLOPs from one place."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import structured_zoo as zoo
from jax.extend import core as jcore
from jax.interpreters import mlir

import jaxprune.structured as structured
from jaxprune.structured import make_plan
from jaxprune.structured._primitives import cost
from jaxprune.structured._primitives import table as primitives
from jaxprune.structured._shared import activation_products
from jaxprune.structured._shrink import apply as shrink
from jaxprune.structured._shrink import verify as oracle


def ones(*shape):
  return np.ones(shape, np.float32)


def _group_of(graph, leaf, axis):
  return graph.leaf_axes[leaf][axis][0].group_id


@jax.custom_vjp
def _scale(h):
  return 2.0 * h


_scale.defvjp(lambda h: (_scale(h), None), lambda _, g: (2.0 * g,))


def _sub_jaxpr_eqns():
  """One equation of every primitive that carries sub-jaxprs, as JAX traces them."""
  double = jax.lax.composite(lambda h: h * 2.0, name='zoo.double')

  def fn(x):
    h = jax.jit(jnp.tanh)(x)
    h = jax.checkpoint(lambda h: _scale(h) + jax.nn.relu(h))(h)
    h = double(h)
    h = jax.lax.cond(x[0] > 0, lambda h: h * 2.0, lambda h: h - 1.0, h)
    h = jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 0.5), (0, h))[1]
    return jax.lax.scan(lambda c, _: (c + 1.0, None), h, None, length=3)[0]

  eqns = []

  def collect(jaxpr):
    for eqn in jaxpr.eqns:
      eqns.append(eqn)
      for sub in jcore.jaxprs_in_params(eqn.params):
        collect(sub)

  collect(jax.make_jaxpr(fn)(ones(4)).jaxpr)
  return eqns


def test_sub_jaxprs_are_listed_once_and_match_what_jax_holds():
  seen = set()
  for eqn in _sub_jaxpr_eqns():
    held = list(jcore.jaxprs_in_params(eqn.params))
    listed = [getattr(j, 'jaxpr', j) for _, j, _ in primitives.sub_jaxprs(eqn)]
    assert [id(j) for j in listed] == [id(j) for j in held], eqn.primitive.name
    if held:
      seen.add(eqn.primitive.name)
      assert primitives.lookup(eqn.primitive.name).shrink is not None, eqn.primitive.name
  assert seen >= {
    'jit',
    'remat2',
    'custom_vjp_call',
    'custom_jvp_call',
    'composite',
    'cond',
    'while',
    'scan',
  }


def test_a_group_behind_a_composite_prunes_and_runs():
  double = jax.lax.composite(lambda h: h * 2.0, name='zoo.double')
  k = jax.random.split(jax.random.key(0), 3)
  params = {'w1': jax.random.normal(k[0], (5, 8)), 'w2': jax.random.normal(k[1], (8, 3))}
  fn = lambda p, x: double(x @ p['w1']) @ p['w2']
  x = jax.random.normal(k[2], (2, 5))
  graph = structured.trace(fn, params, x)
  hidden = _group_of(graph, 'w1', 1)
  assert graph.groups[hidden].prunable
  new, pruned_fn = shrink.apply_plan(graph, params, {hidden: [1, 4, 6]})
  kept = [0, 2, 3, 5, 7]
  expected = (
    2.0 * (np.asarray(x) @ np.asarray(params['w1'])[:, kept]) @ np.asarray(params['w2'])[kept]
  )
  np.testing.assert_allclose(pruned_fn(new, x), expected, rtol=1e-5, atol=1e-5)
  assert oracle.verify(graph, params, {hidden: [1, 4, 6]}, x)


def test_flops_of_a_cond_agree_between_the_graph_and_a_plan():
  params = {'w1': ones(5, 8), 'w2': ones(8, 8), 'w3': ones(8, 3)}

  def fn(p, x):
    h = jax.lax.cond(x[0, 0] > 0, lambda h: h @ p['w2'], lambda h: h * 2.0, x @ p['w1'])
    return h @ p['w3']

  graph = structured.trace(fn, params, ones(2, 5))
  # x @ w1: 2*2*5*8 = 160; one branch of two multiplies by w2: (2*2*8*8) / 2 = 128;
  # @ w3: 2*2*8*3 = 96.
  assert graph.total_flops == 160 + 128 + 96
  assert cost.plan_flops(graph, make_plan(graph, {})) == graph.total_flops
  hidden = graph.groups[_group_of(graph, 'w1', 1)]
  # per channel: 160/8 (w1 out) + 128/8 twice (w2 in and out) + 96/8 (w3 in).
  assert hidden.flops_per_channel == pytest.approx(20 + 16 + 16 + 12)
  # 4 of 8 channels left: 2*2*5*4 + (2*2*4*4) / 2 + 2*2*4*3.
  plan = make_plan(graph, {hidden.id: [0, 1, 2, 3]})
  assert cost.plan_flops(graph, plan) == 80 + 32 + 48


def test_register_primitive_puts_all_three_columns_in_one_entry(monkeypatch):
  monkeypatch.setattr(primitives, 'TABLE', dict(primitives.TABLE))
  prim = jcore.Primitive('zoo_scaled_matmul')
  prim.def_impl(lambda x, w: 3.0 * (x @ w))
  prim.def_abstract_eval(lambda x, w: jax.core.ShapedArray((x.shape[0], w.shape[1]), x.dtype))
  mlir.register_lowering(prim, mlir.lower_fun(lambda x, w: 3.0 * (x @ w), multiple_results=False))
  params = {'w1': ones(5, 8), 'w2': ones(8, 3)}
  fn = lambda p, x: prim.bind(x, p['w1']) @ p['w2']

  def trace_rule(ctx, eqn):
    x, w = eqn.invars
    ctx.join_axes(x, 1, w, 0)
    ctx.join_axes(x, 0, eqn.outvars[0], 0)
    ctx.join_axes(w, 1, eqn.outvars[0], 1)

  def flops_rule(shape, eqn):
    x, w = eqn.invars
    out = eqn.outvars[0]
    return 2.0 * shape(x)[0] * shape(x)[1] * shape(w)[1], [(out, 0), (out, 1), (x, 1)]

  structured.register_primitive('zoo_scaled_matmul', trace=trace_rule, flops=flops_rule)
  x = np.arange(10, dtype=np.float32).reshape(2, 5)
  graph = structured.trace(fn, params, x)
  hidden = _group_of(graph, 'w1', 1)
  # 2*2*5*8 for the new primitive, 2*2*8*3 for the matmul.
  assert graph.total_flops == 160 + 96
  new, pruned_fn = shrink.apply_plan(graph, params, {hidden: [0, 1, 2]})
  assert new['w1'].shape == (5, 5)
  # every entry of x @ w1 is the row sum of x; times 3, times 5 kept channels of ones.
  np.testing.assert_allclose(pruned_fn(new, x), 15.0 * x.sum(1, keepdims=True) * ones(2, 3))
  assert cost.plan_flops(graph, make_plan(graph, {hidden: [0, 1, 2]})) == 2 * 2 * 5 * 5 + 60


def test_registration_checks_its_arguments():
  with pytest.raises(TypeError, match='primitive_name must be a non-empty str'):
    structured.register_shrink_rule('', lambda *a: a)
  with pytest.raises(TypeError, match="rule for 'x' must be callable"):
    structured.register_shrink_rule('x', 'not a rule')
  with pytest.raises(TypeError, match="trace for 'x' must be callable"):
    structured.register_primitive('x', trace=None)
  with pytest.raises(TypeError, match="flops for 'x' must be callable"):
    structured.register_primitive('x', trace=structured.elementwise, flops=3)
  assert 'x' not in primitives.TABLE


def test_register_primitive_keeps_the_sub_jaxpr_columns(monkeypatch):
  monkeypatch.setattr(primitives, 'TABLE', dict(primitives.TABLE))
  jit_entry = structured.primitive_table()['jit']
  structured.register_primitive('jit', trace=jit_entry.trace, shrink=jit_entry.shrink)
  entry = structured.primitive_table()['jit']
  assert (entry.body, entry.subjaxprs, entry.flops) == ('jaxpr', None, None)
  params = {'w1': ones(5, 8), 'w2': ones(8, 3)}
  fn = lambda p, x: jax.jit(lambda a, b: a @ b)(x, p['w1']) @ p['w2']
  graph = structured.trace(fn, params, np.ones((2, 5), np.float32))
  # 2*2*5*8 inside the jit body and 2*2*8*3 outside: the body is still walked.
  assert graph.total_flops == 160 + 96
  with pytest.raises(ValueError, match='not both'):
    structured.register_primitive(
      'y', trace=structured.elementwise, body='jaxpr', subjaxprs=lambda eqn: []
    )
  with pytest.raises(TypeError, match="body for 'y' must be the name of the parameter"):
    structured.register_primitive('y', trace=structured.elementwise, body=3)
  with pytest.raises(TypeError):
    structured.primitive_table()['y'] = entry  # a read-only view
  assert 'y' not in primitives.TABLE


def test_count_flops_can_leave_out_products_of_two_activations():
  params = {'wq': ones(8, 8)}
  fn = lambda p, x: ((x @ p['wq']) @ (x @ p['wq']).T) @ x
  graph = structured.trace(fn, params, np.ones((4, 8), np.float32))
  dense = make_plan(graph, {})
  # x @ wq twice: 2*4*8*8 each; q @ q.T: 2*4*4*8; scores @ x: 2*4*8*4.
  assert cost.plan_flops(graph, dense) == 2 * 512 + 256 + 256
  skip = activation_products(graph, n_inputs=1)
  assert cost.count_flops(graph, dense, skip=skip) == 2 * 512


@pytest.mark.parametrize('case', sorted(zoo.ZOO))
def test_the_dense_flops_are_the_graphs_and_a_plan_that_removes_nothing_counts_them(case):
  """`graph.total_flops` is the dense model's FLOPs that `prune`, `select(flops_target=...)`
  and `channels.shrink` report and aim at; counting an empty plan gives the same number."""
  fn, variables, args, _ = zoo.ZOO[case]()
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    graph = structured.trace(fn, variables, *args)
  assert cost.plan_flops(graph, make_plan(graph, {})) == graph.total_flops
