"""The rules of `structured_zoo_primitives`, groups worked out by hand, and rule coverage.

Every case: x (2, 5) @ w1 (5, 8) goes through the primitive into w2 (8, 3);
where a second path w3 -> w4 exists, the primitive mixes its channel axis.
Shrinking and the oracle run for every case in `structured_shrink_zoo_test`.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import structured_trace_rules_test as rules_tests
from jax.extend import core as jcore
from structured_zoo import ZOO
from structured_zoo_primitives import CASES

import jaxprune.structured as structured
from jaxprune.structured import make_plan
from jaxprune.structured._primitives import control
from jaxprune.structured._primitives import table as primitives
from jaxprune.structured._shrink import apply as shrink
from jaxprune.structured._shrink import verify as oracle

INPUT, OUTPUT = 'reaches model input 0 axis 1', 'reaches model output 0 axis 1'


def groups(name):
  """`{frozenset of (leaf, axis): (size, reason, {(leaf, axis): positions})}` of a case."""
  fn, params, args, _ = CASES[name]()
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    graph = structured.trace(fn, params, *args)
  found = {}
  for g in graph.groups:
    if g.members:
      positions = {(m.leaf, m.axis): m.indices.ravel().tolist() for m in g.members}
      found[frozenset(positions)] = (g.size, g.reason, positions)
  return graph, found


def plain(n):
  return list(range(n))


def _expect(found, members, size, reason, positions=None):
  got_size, got_reason, got_positions = found[frozenset(members)]
  assert (got_size, got_reason) == (size, reason)
  for key, want in (positions or {}).items():
    assert got_positions[key] == want, key


def test_rev_pairs_channel_c_with_row_7_minus_c():
  graph, found = groups('rev')
  _expect(
    found,
    {('w1', 1), ('w2', 0)},
    8,
    None,
    {('w1', 1): plain(8), ('w2', 0): [7, 6, 5, 4, 3, 2, 1, 0]},
  )
  _expect(found, {('w1', 0)}, 5, INPUT)
  _expect(found, {('w2', 1)}, 3, OUTPUT)
  assert len(found) == 3
  # removing channels 0 and 5 of w1 removes rows 7 and 2 of w2.
  fn, params, (x,), _ = CASES['rev']()
  plan = make_plan(graph, {graph.leaf_axes['w1'][1][0].group_id: [0, 5]})
  new, pruned_fn = shrink.apply_plan(graph, params, plan)
  np.testing.assert_array_equal(new['w2'], params['w2'][[0, 1, 3, 4, 5, 6]])
  kept = [1, 2, 3, 4, 6, 7]
  expected = np.flip(np.tanh(np.asarray(x) @ params['w1'][:, kept]), -1) @ new['w2']
  np.testing.assert_allclose(pruned_fn(new, x), expected, rtol=1e-5, atol=1e-5)


def test_iota_is_a_constant_cut_per_use():
  graph, found = groups('iota')
  fn, params, (x,), _ = CASES['iota']()
  assert 'iota' in [e.primitive.name for e in jax.make_jaxpr(fn)(params, x).eqns]
  _expect(found, {('w1', 1), ('w2', 0)}, 8, None)
  assert len(found) == 3
  plan = make_plan(graph, {graph.leaf_axes['w1'][1][0].group_id: [2, 3, 7]})
  new, pruned_fn = shrink.apply_plan(graph, params, plan)
  kept = [0, 1, 4, 5, 6]
  # channel c is scaled by c + 1: the kept channels keep their own factors.
  expected = (np.asarray(x) @ params['w1'][:, kept] * (np.array(kept) + 1.0)) @ new['w2']
  np.testing.assert_allclose(pruned_fn(new, x), expected, rtol=1e-5, atol=1e-5)


def test_scatter_add():
  graph, found = groups('scatter_add')
  assert 'scatter-add' in str(graph.closed_jaxpr)
  _expect(found, {('w1', 1), ('w2', 0)}, 8, None)
  # 8 channels added at offset 2 of a 12-wide buffer: a part of the axis.
  _expect(found, {('w3', 1)}, 8, "blocked by primitive 'scatter-add'")
  _expect(found, {('w4', 0)}, 12, "blocked by primitive 'scatter-add'")
  _expect(found, {('w1', 0), ('w3', 0)}, 5, INPUT)
  _expect(found, {('w2', 1), ('w4', 1)}, 3, OUTPUT)
  assert len(found) == 5


def test_dynamic_update_slice():
  _, found = groups('dynamic_update_slice')
  _expect(found, {('w1', 1), ('w2', 0)}, 8, None)
  # 8 channels written at offset 2 of a 12-wide buffer: a part of the axis.
  _expect(found, {('w3', 1)}, 8, "blocked by primitive 'dynamic_update_slice'")
  _expect(found, {('w4', 0)}, 12, "blocked by primitive 'dynamic_update_slice'")
  _expect(found, {('w1', 0), ('w3', 0)}, 5, INPUT)
  _expect(found, {('w2', 1), ('w4', 1)}, 3, OUTPUT)
  assert len(found) == 5


def test_reduce_window_passes_channels_and_blocks_windows():
  graph, found = groups('reduce_window')
  _expect(found, {('w1', 1), ('w2', 0)}, 8, None)
  _expect(found, {('w1', 0)}, 3, 'reaches model input 0 axis 3')
  _expect(found, {('w2', 1)}, 3, OUTPUT)
  assert len(found) == 3
  # the 4x4 spatial axes of x @ w1 are windowed (and come from the input).
  jaxpr = graph.closed_jaxpr.jaxpr
  pooled_in = next(e for e in jaxpr.eqns if e.primitive.name == 'reduce_window_max').invars[0]
  spatial = [graph.groups[p.group_id] for a in (1, 2) for p in graph.var_axes[((), pooled_in)][a]]
  assert {g.reason for g in spatial} == {
    'reaches model input 0 axis 1',
    'reaches model input 0 axis 2',
  }


def test_bitcast_same_width_is_elementwise_narrower_blocks():
  _, found = groups('bitcast')
  _expect(found, {('w1', 1), ('w2', 0)}, 8, None)
  _expect(found, {('w3', 1)}, 8, "blocked by primitive 'bitcast_convert_type'")
  _expect(found, {('w4', 0)}, 8, "blocked by primitive 'bitcast_convert_type'")
  assert len(found) == 5


@pytest.mark.parametrize(
  'name, reason',
  [('top_k', "blocked by primitive 'top_k'"), ('argmax', "reduced over by 'argmax'")],
)
def test_selection_over_the_batch_keeps_channels_over_channels_blocks(name, reason):
  _, found = groups(name)
  _expect(found, {('w1', 1), ('w2', 0)}, 8, None)
  _expect(found, {('w3', 1)}, 8, reason)
  _expect(found, {('w1', 0), ('w3', 0)}, 5, INPUT)
  _expect(found, {('w2', 1), ('w4', 1)}, 3, OUTPUT)
  assert len(found) == 4


def test_unstack_of_rows_keeps_channels_of_channels_blocks():
  _, found = groups('unstack')
  _expect(
    found, {('w1', 1), ('w2', 0), ('w2b', 0)}, 8, None, {('w2', 0): plain(8), ('w2b', 0): plain(8)}
  )
  _expect(found, {('w3', 1)}, 4, "axis split by 'unstack'")
  assert len(found) == 4


def test_psum_over_a_vmap_axis_reduces_the_batch_and_passes_channels():
  graph, found = groups('psum')
  _expect(found, {('w1', 1), ('w2', 0)}, 8, None)
  _expect(found, {('w1', 0)}, 5, INPUT)
  _expect(found, {('w2', 1)}, 3, OUTPUT)
  assert len(found) == 3
  fn, params, (x,), _ = CASES['psum']()
  plan = make_plan(graph, {graph.leaf_axes['w1'][1][0].group_id: [3]})
  new, pruned_fn = shrink.apply_plan(graph, params, plan)
  h = np.asarray(x) @ np.delete(params['w1'], 3, axis=1)
  expected = (h - h.mean(0)) @ np.delete(params['w2'], 3, axis=0)
  np.testing.assert_allclose(pruned_fn(new, x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('name', sorted(CASES))
def test_every_case_shrinks_and_passes_the_oracle(name):
  fn, params, args, _ = CASES[name]()
  graph, _ = groups(name)
  plan = {g.id: [0, g.size - 1] for g in graph.prunable_groups}
  assert plan
  assert oracle.verify(graph, params, plan, *args)
  new, pruned_fn = shrink.apply_plan(graph, params, plan)
  assert pruned_fn(new, *args).shape == fn(params, *args).shape


# Rules whose hand-worked case is a plain function in structured_trace_rules_test.
_COVERED_ELSEWHERE = {
  'cumsum': 'test_position_mixing_primitives_block_their_axis',
  'sort': 'test_position_mixing_primitives_block_their_axis',
  'slice': 'test_slice_joins_the_kept_range_and_blocks_a_picked_position',
  'pad': 'test_pad_offsets_positions',
  'dynamic_slice': 'test_full_dynamic_slice_passes_channels_through',
  'tile': 'test_tile_copies_stack_and_composite',
  'stack': 'test_tile_copies_stack_and_composite',
  'random_bits': 'test_dropout_in_train_mode_does_not_block',
  'conv_general_dilated': 'test_group_norm_keeps_whole_norm_groups_and_conv_transpose_maps_'
  'features',
}
# Rules with no hand-worked case: printing and placement, which carry no channel values.
_NO_CASE = {
  'debug_print',
  'debug_callback',
  'optimization_barrier',
  'sharding_constraint',
  'layout_constraint',
  'with_memory_space_constraint',
  'reshard',
  'device_put',
}


def _primitives_used(jaxpr, found):
  for eqn in jaxpr.eqns:
    found.add(eqn.primitive.name)
    for sub in jcore.jaxprs_in_params(eqn.params):
      _primitives_used(getattr(sub, 'jaxpr', sub), found)
  return found


def test_every_rule_of_the_table_has_a_hand_worked_case():
  used = set()
  for make in ZOO.values():
    fn, variables, args, _ = make()
    _primitives_used(jax.make_jaxpr(fn)(variables, *args).jaxpr, used)
  for primitive, test_name in _COVERED_ELSEWHERE.items():
    assert callable(getattr(rules_tests, test_name)), test_name
    used.add(primitive)
  reached = {primitives.TABLE[p].trace for p in used if p in primitives.TABLE}
  rules_with_entries = {}
  for name, entry in primitives.TABLE.items():
    rules_with_entries.setdefault(entry.trace, set()).add(name)
  missing = sorted(
    min(names)
    for rule, names in rules_with_entries.items()
    if rule not in reached and not names <= _NO_CASE
  )
  assert not missing, f'trace rules with no hand-worked case: {missing}'


def test_a_scan_in_neither_form_is_refused_naming_both():
  # jax < 0.11 writes num_consts/num_carry, jax >= 0.11 ft_in/ft_out (both read by
  # `_core/params.py`); a scan with neither is a clear error, not a KeyError.
  closed = jax.make_jaxpr(
    lambda x: jax.lax.scan(lambda c, _: (c * 2.0, None), x, None, length=3)[0]
  )(jnp.ones(2))
  [eqn] = [e for e in closed.jaxpr.eqns if e.primitive.name == 'scan']
  neither = eqn.replace(
    params={k: v for k, v in eqn.params.items() if k not in ('num_consts', 'ft_in')}
  )
  with pytest.raises(
    NotImplementedError,
    match=r'num_consts/num_carry \(jax<0\.11\) or '
    r'ft_in/ft_out \(jax>=0\.11\)',
  ):
    control.scan_subjaxprs(neither)
  assert control.scan_subjaxprs(eqn)[0][2] == 3.0  # this jax's scan reads
