"""The chain-order check reads optax's private frames (`jaxprune/_transform/order.py`): the local
names it reads are optax's, what it makes of them, and which errors it lets through."""

import sys

import jax.numpy as jnp
import optax
import pytest

import jaxprune
from jaxprune._transform import order as order

PARAMS = {'Dense_0': {'kernel': jnp.arange(8.0).reshape(2, 4)}}


def _frame_locals(wrap):
  """The locals of the nearest optax `update_fn` frame (optax's own wrappers between)
  above a transform inside `wrap`, as `order._followed` walks to it."""
  seen = {}

  def update(updates, state, params=None):
    frame = sys._getframe(1)
    while not ({'update_fns', 'transforms'} & set(frame.f_locals)):
      assert frame.f_code.co_filename.startswith(order._OPTAX_DIR)
      frame = frame.f_back
    assert frame.f_code.co_name == 'update_fn'
    seen.update(frame.f_locals)
    return updates, state

  tx = wrap(optax.GradientTransformation(lambda params: optax.EmptyState(), update))
  tx.update(PARAMS, tx.init(PARAMS), PARAMS)
  return seen


def test_optax_chain_loops_with_the_local_names_read():
  names = _frame_locals(lambda tx: optax.chain(optax.identity(), tx))
  assert {'update_fns', 'fn', 's', 'state', 'updates', 'params', 'extra_args'} <= set(names)
  assert names['fn'] is names['update_fns'][1] and names['s'] is names['state'][1]


def test_optax_named_chain_loops_with_the_local_names_read():
  names = _frame_locals(lambda tx: optax.named_chain(('first', optax.identity()), ('me', tx)))
  assert {'transforms', 'name', 'state', 'updates', 'params', 'extra_args'} <= set(names)
  assert names['name'] == 'me' and [n for n, _ in names['transforms']] == ['first', 'me']


def test_the_current_transform_and_those_after_it():
  first, second, third = (optax.identity() for _ in range(3))
  chain = {
    'update_fns': (first.update, second.update, third.update),
    'fn': second.update,
    'state': ('s0', 's1', 's2'),
    's': 's1',
  }
  assert order._current_and_later(chain) == ('s1', [(third.update, 's2')])
  named = {
    'transforms': [('a', first), ('b', second), ('c', third)],
    'name': 'a',
    'state': {'a': 'sa', 'b': 'sb', 'c': 'sc'},
  }
  assert order._current_and_later(named) == ('sa', [(second.update, 'sb'), (third.update, 'sc')])


def _chain_locals(later):
  """A chain's loop locals with `pruning` current and `later` after it."""
  pruning = jaxprune.pruning('target_sparsity=0.5')
  state = (pruning.init(PARAMS), later.init(PARAMS))
  return {
    'update_fns': (pruning.update, later.update),
    'fn': pruning.update,
    'state': state,
    's': state[0],
    'updates': PARAMS,
    'params': PARAMS,
    'extra_args': {},
  }


def test_what_a_later_transform_does_to_the_pruned_updates():
  assert order._changes_pruned_updates(_chain_locals(optax.scale(2.0))) is True
  assert order._changes_pruned_updates(_chain_locals(optax.identity())) is False


def test_locals_of_other_kinds_count_as_a_change():
  broken = _chain_locals(optax.identity())
  del broken['state']  # another optax: KeyError
  assert order._changes_pruned_updates(broken) is True
  twice = _chain_locals(optax.identity())
  twice['update_fns'] = twice['update_fns'] * 2  # the current transform twice: ValueError
  assert order._changes_pruned_updates(twice) is True


def test_a_later_transform_jax_cannot_trace_counts_as_a_change():
  def update(updates, state, params=None):
    if float(updates['Dense_0']['kernel'][0, 0]) > 0:  # a concrete value: fails on tracers
      updates = jax_tree_scale(updates, 2.0)
    return updates, state

  later = optax.GradientTransformation(lambda params: optax.EmptyState(), update)
  assert order._changes_pruned_updates(_chain_locals(later)) is True


def jax_tree_scale(tree, factor):
  return {k: {n: v * factor for n, v in d.items()} for k, d in tree.items()}


def test_other_errors_of_a_later_transform_are_not_swallowed():
  def update(updates, state, params=None):
    raise ZeroDivisionError('a bug in the later transform')

  later = optax.GradientTransformation(lambda params: optax.EmptyState(), update)
  with pytest.raises(ZeroDivisionError, match='a bug in the later transform'):
    order._changes_pruned_updates(_chain_locals(later))
