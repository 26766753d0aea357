"""`_core/params.py`: one reader of loop and call parameters, for both forms of `scan`.

jax < 0.11 writes a scan's layout as `num_consts`/`num_carry`; jax >= 0.11 as
flat-tree descriptors `ft_in` (consts, carry, xs) and `ft_out` (carry, ys), and
`jit`'s `inline` as a `jax.Inline`. The installed JAX traces the real
equations; the other form is built from them as that JAX would write it, with
jax's own flat-tree module where it has one and a minimal stand-in otherwise.
"""

import enum
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import structured_zoo as zoo
from jax.extend import core as jcore

import jaxprune.structured as structured
from jaxprune.structured._core import params
from jaxprune.structured._primitives import control, traversal
from jaxprune.structured._trace import kinds


# A minimal stand-in for jax 0.11's flat-tree descriptors (`jax._src.flattree`): a
# tuple of descriptors, and a leaf; `len()` counts flat values, `unpack()` gives a
# tuple's parts. `params` finds `pack`/`nones` in the module defining the class.
class _Tuple:
  def __init__(self, *elts):
    self.elts = elts

  def __len__(self):
    return sum(len(e) for e in self.elts)

  def __eq__(self, other):
    return isinstance(other, _Tuple) and self.elts == other.elts

  def __hash__(self):
    return hash(self.elts)

  def unpack(self):
    return self.elts


class _Leaf:
  def __init__(self, val=None):
    self.val = val

  def __len__(self):
    return 1

  def __eq__(self, other):
    return isinstance(other, _Leaf) and self.val == other.val

  def __hash__(self):
    return hash(self.val)


def pack(tree):
  return tree if not isinstance(tree, tuple) else _Tuple(*(pack(t) for t in tree))


def nones(n):
  return _Tuple(*(_Leaf() for _ in range(n)))


try:
  from jax._src import flattree as ft  # jax >= 0.11
except ImportError:
  ft = sys.modules[__name__]

_OLD = ('num_consts', 'num_carry', 'linear', '_split_transpose')
_NEW = ('ft_in', 'ft_out')


def _counts(ft_part):
  return [len(p) for p in ft_part.unpack()]


def _as_old(eqn, n_consts, n_carry):
  """`eqn` with the jax < 0.11 scan parameters."""
  kept = {k: v for k, v in eqn.params.items() if k not in _NEW}
  return eqn.replace(params={**kept, 'num_consts': n_consts, 'num_carry': n_carry})


def _as_new(eqn, n_consts, n_carry, ft_in=None):
  """`eqn` with the jax >= 0.11 scan parameters, as `lax.scan` binds them."""
  kept = {k: v for k, v in eqn.params.items() if k not in _OLD}
  n_xs = len(eqn.invars) - n_consts - n_carry
  n_ys = len(eqn.outvars) - n_carry
  if ft_in is None:
    ft_in = ft.pack((ft.nones(n_consts), ft.nones(n_carry), ft.nones(n_xs)))
  ft_out = ft.pack((ft.nones(n_carry), ft.nones(n_ys)))
  return eqn.replace(params={**kept, 'ft_in': ft_in, 'ft_out': ft_out})


def _scan_eqn():
  """A real scan: 1 const (w), 2 carries, 2 xs, 3 ys, length 4, reversed."""

  def fn(w, c0, c1, xs0, xs1):
    def body(c, x):
      a, b = c
      return (a * x[0] + w, b - x[1]), (a * 2.0, b + w, x[0] * b)

    return jax.lax.scan(body, (c0, c1), (xs0, xs1), reverse=True)

  closed = jax.make_jaxpr(fn)(1.0, jnp.ones(3), 2.0, jnp.ones((4, 3)), jnp.ones(4))
  [eqn] = [e for e in closed.jaxpr.eqns if e.primitive.name == 'scan']
  return eqn


def test_scan_reads_the_same_layout_from_both_forms():
  eqn = _scan_eqn()
  old, new = _as_old(eqn, 1, 2), _as_new(eqn, 1, 2)
  assert 'ft_in' not in old.params and 'num_consts' not in new.params
  read_old, read_new = params.scan(old), params.scan(new)
  assert read_old == read_new
  assert params.scan(eqn) == read_old  # the installed JAX's own form
  assert (read_old.n_consts, read_old.n_carry, read_old.n_xs, read_old.n_ys) == (1, 2, 2, 3)
  assert read_old.n_fixed == 3
  assert read_new.body is eqn.params['jaxpr'] and read_new.length == 4 and read_new.reverse
  assert read_new.unroll == eqn.params['unroll']
  # The body takes consts, carries and one step of xs; it gives carries, then ys.
  body = control.inner(read_new.body)
  assert len(body.invars) == 5 and len(body.outvars) == 5


def test_scan_counts_nested_descriptors_flat():
  # jax 0.11's linearize and jvp rules nest the parts, e.g. consts as (residuals,
  # consts) or each part as (primals, tangents): a part counts all its flat values.
  eqn = _scan_eqn()
  nested = ft.pack(((ft.nones(0), ft.nones(1)), (ft.nones(1), ft.nones(1)), ft.nones(2)))
  read = params.scan(_as_new(eqn, 1, 2, ft_in=nested))
  assert (read.n_consts, read.n_carry, read.n_xs, read.n_ys) == (1, 2, 2, 3)


def test_scan_with_more_consts_is_written_in_the_equations_form():
  eqn = _scan_eqn()
  body = eqn.params['jaxpr']
  old, new = _as_old(eqn, 1, 2), _as_new(eqn, 1, 2)
  assert params.scan_with_consts(old, body, 0) == {'jaxpr': body}
  assert params.scan_with_consts(new, body, 0) == {'jaxpr': body}

  written = params.scan_with_consts(old, body, 2)
  assert written == {'jaxpr': body, 'num_consts': 3}
  # jax < 0.10 also had one `linear` flag per operand: the new consts are not linear.
  linear = (False, True, False, False, True)
  with_linear = old.replace(params={**old.params, 'linear': linear})
  assert params.scan_with_consts(with_linear, body, 2)['linear'] == (False, False) + linear

  written = params.scan_with_consts(new, body, 2)
  assert set(written) == {'jaxpr', 'ft_in'}  # ft_out and everything else as traced
  assert _counts(written['ft_in']) == [3, 2, 2]
  assert type(written['ft_in']).__module__ == type(new.params['ft_in']).__module__
  rebuilt = new.replace(params={**new.params, **written}, invars=[*eqn.invars[:2], *eqn.invars])
  read = params.scan(rebuilt)
  assert (read.n_consts, read.n_carry, read.n_xs, read.n_ys) == (3, 2, 2, 3)


def test_scan_with_more_consts_binds_on_the_installed_jax():
  eqn = _scan_eqn()
  closed = eqn.params['jaxpr']
  body = control.inner(closed)
  extra = jcore.Var(jax.typeof(jnp.zeros(3)))  # an unused leading const
  hoisted = jcore.ClosedJaxpr(body.replace(invars=[extra, *body.invars]), closed.consts)
  args = [1.5, jnp.arange(3.0), 2.0, jnp.ones((4, 3)), jnp.arange(4.0)]
  want = eqn.primitive.bind(*args, **eqn.params)
  new = {**eqn.params, **params.scan_with_consts(eqn, hoisted, 1)}
  got = eqn.primitive.bind(jnp.zeros(3), *args, **new)
  for a, b in zip(want, got, strict=True):
    np.testing.assert_allclose(a, b)


def test_while_cond_and_calls_are_read_from_the_traced_equations():
  def fn(x):
    h = jax.jit(jnp.tanh)(x)
    h = jax.lax.cond(x[0] > 0, lambda h: h * 2.0, lambda h: h - x, h)
    return jax.lax.while_loop(lambda c: c[0] < x[1], lambda c: (c[0] + 1.0, c[1] * x), (0.0, h))

  eqns = {e.primitive.name: e for e in jax.make_jaxpr(fn)(jnp.ones(2)).jaxpr.eqns}
  loop = params.while_loop(eqns['while'])
  assert (loop.cond_nconsts, loop.body_nconsts) == (1, 1)
  assert loop.cond is eqns['while'].params['cond_jaxpr']
  assert loop.body is eqns['while'].params['body_jaxpr']
  assert params.while_with_consts(eqns['while'], 'c', 'b', 2, 3) == {
    'cond_jaxpr': 'c',
    'body_jaxpr': 'b',
    'cond_nconsts': 3,
    'body_nconsts': 4,
  }
  assert params.branches(eqns['cond']) == tuple(eqns['cond'].params['branches'])
  assert len(params.branches(eqns['cond'])) == 2
  assert params.cond_with_branches(eqns['cond'], ['a', 'b']) == {'branches': ('a', 'b')}
  assert params.call_body(eqns['jit'], 'jaxpr') is eqns['jit'].params['jaxpr']


def test_a_call_body_renamed_between_jaxpr_and_call_jaxpr_is_found_under_either():
  # `composite` holds its body in `jaxpr` up to jax 0.11.0 and in `call_jaxpr` in 0.11.2.
  double = jax.lax.composite(lambda h: h * 2.0, name='test.double')
  [eqn] = jax.make_jaxpr(double)(jnp.ones(2)).jaxpr.eqns
  [name] = [k for k in ('jaxpr', 'call_jaxpr') if k in eqn.params]
  body = eqn.params[name]
  rest = {k: v for k, v in eqn.params.items() if k != name}
  for held in ('jaxpr', 'call_jaxpr'):
    renamed = eqn.replace(params={**rest, held: body})
    assert params.call_body(renamed, 'jaxpr') is body
    assert params.call_body(renamed, 'call_jaxpr') is body
  assert traversal.call_body(eqn) is body
  with pytest.raises(KeyError, match="composite has no body parameter 'jaxpr'"):
    params.call_body(eqn.replace(params=rest), 'jaxpr')


class _Inline(enum.Enum):  # jax 0.11's `jax.Inline`, where the installed JAX lacks it
  JAX_EARLY = 'jax_early'
  JAX_LATE = 'jax_late'
  XLA_EARLY = 'xla_early'
  XLA_LATE = 'xla_late'
  AUTO = 'auto'


def test_jit_inline_reads_the_bool_and_the_enum():
  [eqn] = jax.make_jaxpr(lambda x: jax.jit(jnp.sin)(x))(1.0).jaxpr.eqns
  inline = getattr(jax, 'Inline', _Inline)
  with_inline = lambda value: eqn.replace(params={**eqn.params, 'inline': value})
  assert params.inlines(with_inline(True)) and not params.inlines(with_inline(False))
  assert params.inlines(with_inline(inline.JAX_EARLY))
  for other in ('JAX_LATE', 'XLA_EARLY', 'XLA_LATE', 'AUTO'):
    assert not params.inlines(with_inline(getattr(inline, other)))
  assert not params.inlines(eqn)  # a traced jit is not inlined when traced


def _layout(eqn):
  """`(n_consts, n_carry)` of a scan, read straight from whichever form it has."""
  if 'num_consts' in eqn.params:
    return eqn.params['num_consts'], eqn.params['num_carry']
  return tuple(_counts(eqn.params['ft_in'])[:2])


def _other_form(closed):
  """`closed` with every scan (in sub-jaxprs too) rewritten in the form the installed
  JAX does not write: jax >= 0.11's under jax 0.10, jax 0.10's under jax 0.11."""

  def sub(value):
    if isinstance(value, (jcore.Jaxpr, jcore.ClosedJaxpr)):
      return _other_form(value)
    if (
      isinstance(value, tuple)
      and value
      and all(isinstance(v, (jcore.Jaxpr, jcore.ClosedJaxpr)) for v in value)
    ):
      return tuple(_other_form(v) for v in value)
    return value

  jaxpr = control.inner(closed)
  eqns = []
  for eqn in jaxpr.eqns:
    eqn = eqn.replace(params={k: sub(v) for k, v in eqn.params.items()})
    if eqn.primitive.name == 'scan':
      rewrite = _as_new if 'num_consts' in eqn.params else _as_old
      eqn = rewrite(eqn, *_layout(eqn))
    eqns.append(eqn)
  new = jaxpr.replace(eqns=eqns)
  if isinstance(closed, jcore.ClosedJaxpr) and closed.jaxpr is not closed:
    return jcore.ClosedJaxpr(new, closed.consts)
  return new


def _rnn():
  k = jax.random.split(jax.random.key(0), 4)
  variables = {
    'w_in': jax.random.normal(k[0], (5, 8)),
    'w_h': jax.random.normal(k[1], (8, 8)),
    'w_out': jax.random.normal(k[2], (8, 3)),
  }

  def fn(v, xs):  # xs: (time, batch, 5)
    def step(h, x):
      h = jnp.tanh(x @ v['w_in'] + h @ v['w_h'])
      return h, h @ v['w_out']

    return jax.lax.scan(step, jnp.zeros((xs.shape[1], 8)), xs)[1]

  return fn, variables, (jax.random.normal(k[3], (4, 2, 5)),)


def _scanned_stack():
  fn, variables, args, _ = zoo.scanned_layers()
  return fn, variables, args


@pytest.mark.parametrize('make', [_scanned_stack, _rnn])
def test_a_scanned_model_traces_the_same_from_either_form(make, monkeypatch):
  fn, variables, args = make()
  graph = structured.trace(fn, variables, *args)
  assert graph.prunable_groups
  closed = jax.make_jaxpr(fn)(variables, *args)
  installed = 'num_consts' if any('num_consts' in e.params for e in closed.jaxpr.eqns) else 'ft_in'
  other = _other_form(closed)
  assert not any(installed in e.params for e in other.jaxpr.eqns)
  # Every reader of scan parameters sees the same loops: the traversal, the
  # input-dependence analysis (recurrent units) and the channel walk.
  rows = lambda c: [(s, i, e.primitive.name, t) for s, i, e, t in traversal.equations(c)]
  assert rows(other) == rows(closed)
  n_leaves = len(jax.tree_util.tree_leaves(variables))
  n_args = len(jax.tree_util.tree_leaves(args))
  found = [set(), set()]
  for c, seen in zip((closed, other), found, strict=True):
    kinds.dependent(c.jaxpr, [False] * n_leaves + [True] * n_args, (), seen)
  assert {(s, str(v)) for s, v in found[0]} == {(s, str(v)) for s, v in found[1]}

  make_jaxpr = jax.make_jaxpr

  def make_other(*a, **k):
    traced = make_jaxpr(*a, **k)

    def run(*x):
      out = traced(*x)
      return (_other_form(out[0]), out[1]) if isinstance(out, tuple) else _other_form(out)

    return run

  monkeypatch.setattr(jax, 'make_jaxpr', make_other)
  again = structured.trace(fn, variables, *args)
  monkeypatch.undo()
  eqns = again.entries[0].closed_jaxpr.jaxpr.eqns
  assert any(e.primitive.name == 'scan' for e in eqns)
  assert not any(installed in e.params for e in eqns)
  assert repr(again.groups) == repr(graph.groups)
  assert again.total_flops == graph.total_flops


def test_a_scanned_flax_model_prunes_and_runs_on_the_installed_jax():
  class Block(nn.Module):
    @nn.compact
    def __call__(self, x, _):
      return x + nn.Dense(4, name='out')(nn.relu(nn.Dense(10, name='hidden')(x))), None

  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      x, _ = nn.scan(Block, variable_axes={'params': 0}, split_rngs={'params': True}, length=2)(
        name='blocks'
      )(x, None)
      return x

  x = jax.random.normal(jax.random.key(1), (3, 4))
  model = Model()
  variables = model.init(jax.random.key(0), x)
  graph = structured.trace(model.apply, variables, x)
  [hidden] = [
    g for g in graph.prunable_groups if any(m.leaf.endswith('hidden/kernel') for m in g.members)
  ]
  assert hidden.size == 10
  plan = structured.make_plan(graph, {hidden.id: [0, 3, 7]})
  new, pruned = structured.apply_plan(graph, variables, plan)
  assert new['params']['blocks']['hidden']['kernel'].shape == (2, 4, 7)
  assert pruned(new, x).shape == (3, 4)
  assert structured.verify(graph, variables, plan, x)
