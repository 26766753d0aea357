"""Selectors and constraints; counts and FLOPs worked out by hand."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxprune.structured import ChannelGroup, Constraint, Member, make_plan, trace
from jaxprune.structured._primitives import cost
from jaxprune.structured._select import selectors

# Exact counts: no rounding of the kept channels (the default rounds to 8).
EXACT = Constraint(round_to=1)


def _group(gid, size, leaf, prunable=True):
  return ChannelGroup(
    gid,
    size,
    [Member(leaf, 0, np.arange(size).reshape(size, 1))],
    prunable,
    None if prunable else 'reaches model output',
    1.0,
  )


def _graph(*sizes):
  return types.SimpleNamespace(
    groups=[_group(i, n, f'params/layer{i}/kernel') for i, n in enumerate(sizes)]
  )


def _descending(graph):
  """Scores where channel 0 matters most: the last channels go first."""
  return {g.id: np.arange(g.size, 0, -1, dtype=np.float64) for g in graph.groups}


def test_uniform_removes_the_ratio_least_important():
  graph = _graph(64, 20, 4)
  plan = selectors.uniform(graph, _descending(graph), 0.5, EXACT)
  np.testing.assert_array_equal(plan.removed[0], np.arange(32, 64))
  np.testing.assert_array_equal(plan.removed[1], np.arange(10, 20))
  np.testing.assert_array_equal(plan.removed[2], [2, 3])
  np.testing.assert_array_equal(plan.kept(1), np.arange(10))
  assert plan.num_removed == 44


def test_constraints_round_minimum_lock_and_never_empty():
  graph = _graph(64, 20, 4)
  scores = _descending(graph)
  plan = selectors.uniform(graph, scores, 0.5, Constraint(round_to=8))
  # keep 32 of 64; of 20 the allowed keeps are 8, 16, 20 and 10 rounds up to 16; 4 < 8 stays.
  assert [plan.sizes[g] - len(plan.removed.get(g, [])) for g in range(3)] == [32, 16, 4]
  assert Constraint().round_to == 1  # the default removes what was asked
  plan = selectors.uniform(
    graph, scores, 0.5, Constraint(min_ratio=0.75, min_channels=2, round_to=1)
  )
  assert len(plan.removed[0]) == 16 and len(plan.removed[1]) == 5 and len(plan.removed[2]) == 1
  plan = selectors.uniform(
    graph, scores, 0.5, Constraint(min_channels=40, locked=('layer1',), round_to=1)
  )
  assert len(plan.removed[0]) == 24 and 1 not in plan.removed and 2 not in plan.removed
  plan = selectors.uniform(graph, scores, 0.99, EXACT)
  assert [len(plan.kept(g)) for g in range(3)] == [1, 1, 1]
  with pytest.raises(ValueError, match='min_channels=0'):
    Constraint(min_channels=0)
  with pytest.raises(ValueError, match='round_to=0'):
    Constraint(round_to=0)


def test_unprunable_groups_are_untouched_and_plans_are_checked():
  graph = types.SimpleNamespace(groups=[_group(0, 4, 'a'), _group(1, 4, 'b', prunable=False)])
  plan = selectors.uniform(graph, _descending(graph), 0.5, EXACT)
  assert set(plan.removed) == {0}
  with pytest.raises(ValueError, match='group 1 is not prunable'):
    make_plan(graph, {1: [0]})
  with pytest.raises(ValueError, match='would empty it'):
    make_plan(graph, {0: [0, 1, 2, 3]})
  with pytest.raises(ValueError, match='channels 0..3, got 2..7'):
    make_plan(graph, {0: [2, 7]})
  with pytest.raises(ValueError, match='group 5 does not exist'):
    make_plan(graph, {5: [0]})


def test_global_ranks_channels_across_groups():
  graph = _graph(3, 3)
  scores = {0: np.array([0.1, 2.0, 0.9]), 1: np.array([1.5, 0.2, 0.3])}
  plan = selectors.global_(graph, scores, 3, EXACT)
  # the three lowest overall: 0.1 (g0 c0), 0.2 (g1 c1), 0.3 (g1 c2).
  np.testing.assert_array_equal(plan.removed[0], [0])
  np.testing.assert_array_equal(plan.removed[1], [1, 2])
  plan = selectors.global_(graph, scores, 0.5, EXACT)  # half of 6 channels: the same 3
  assert plan.num_removed == 3
  # never empties a group: asking for 5 of 6 leaves one channel in each.
  with pytest.warns(UserWarning, match='cannot be reached'):
    plan = selectors.global_(graph, scores, 5, EXACT)
  assert [len(plan.kept(g)) for g in range(2)] == [1, 1]
  with pytest.raises(ValueError, match='amount=1.5'):
    selectors.global_(graph, scores, 1.5)


def _mlp():
  k = jax.random.split(jax.random.key(0), 4)
  params = {
    'w1': jax.random.normal(k[0], (40, 8)),
    'w2': jax.random.normal(k[1], (8, 8)),
    'w3': jax.random.normal(k[2], (8, 2)),
  }
  fn = lambda p, x: jax.nn.relu(jax.nn.relu(x @ p['w1']) @ p['w2']) @ p['w3']
  x = jax.random.normal(k[3], (2, 40))
  graph = trace(fn, params, x)
  h1 = next(g.id for g in graph.groups if any(m.leaf == 'w1' and m.axis == 1 for m in g.members))
  h2 = next(g.id for g in graph.groups if any(m.leaf == 'w3' and m.axis == 0 for m in g.members))
  return graph, params, h1, h2


def _mlp_flops(r1, r2):
  # batch 2, a multiply-add is 2 FLOPs: 40 x h1 + h1 x h2 + h2 x 2.
  h1, h2 = 8 - r1, 8 - r2
  return 2 * 2 * (40 * h1 + h1 * h2 + h2 * 2)


def test_plan_flops_counts_both_sides_of_each_matmul():
  graph, _, h1, h2 = _mlp()
  assert cost.plan_flops(graph, make_plan(graph, {})) == _mlp_flops(0, 0) == graph.total_flops
  plan = make_plan(graph, {h1: [0, 1, 2, 3], h2: [5, 6]})
  assert cost.plan_flops(graph, plan) == _mlp_flops(4, 2)


def test_flops_target_greedy_reaches_it_with_the_fewest_channels():
  graph, params, h1, h2 = _mlp()
  plan = selectors.select(graph, params, flops_target=0.5, constraint=EXACT)
  flops = cost.plan_flops(graph, plan)
  assert flops <= 0.5 * _mlp_flops(0, 0)
  # one channel fewer (the most important of those removed) would miss the target.
  scores = selectors.importance_lib.score_channels(graph, params, 'l2')
  removed = [(scores[g][c], g, c) for g, cs in plan.removed.items() for c in cs]
  _, g, c = max(removed)
  fewer = make_plan(
    graph, {gid: [x for x in cs if (gid, x) != (g, c)] for gid, cs in plan.removed.items()}
  )
  assert cost.plan_flops(graph, fewer) > 0.5 * _mlp_flops(0, 0)


def test_flops_target_knapsack_prefers_channels_that_save_more():
  graph, params, h1, h2 = _mlp()
  equal = {g.id: np.ones(g.size) for g in graph.groups}
  greedy = selectors.select(graph, params, flops_target=0.5, importance=equal, constraint=EXACT)
  knap = selectors.select(
    graph, params, flops_target=0.5, importance=equal, search='knapsack', constraint=EXACT
  )
  assert cost.plan_flops(graph, knap) <= 0.5 * _mlp_flops(0, 0)
  # h1 alone: 4 * (48 * h1 + 16) <= 800 needs h1 <= 3, i.e. 5 channels; mixing needs more
  # (4 from h1 then 4 * (160 + 6 * h2) <= 800 needs 2 from h2).
  assert len(knap.removed.get(h1, [])) == 5 and h2 not in knap.removed
  assert knap.num_removed <= greedy.num_removed


def test_latency_target_and_argument_errors():
  graph, params, h1, h2 = _mlp()
  kept = lambda plan: float(16 - plan.num_removed)
  plan = selectors.select(graph, params, latency_fn=kept, latency_target=10.0, constraint=EXACT)
  assert plan.num_removed == 6
  with pytest.raises(ValueError, match='exactly one of'):
    selectors.select(graph, params, ratio=0.5, flops_target=0.5)
  with pytest.raises(ValueError, match='flops_target=1.5'):
    selectors.select(graph, params, flops_target=1.5)
  with pytest.raises(ValueError, match="scope='layer'"):
    selectors.select(graph, params, ratio=0.5, scope='layer')
  with pytest.raises(ValueError, match="search='beam'"):
    selectors.select(graph, params, flops_target=0.5, search='beam')


def test_select_uniform_on_a_traced_model_uses_l2():
  graph, params, h1, h2 = _mlp()
  params = dict(params, w1=params['w1'].at[:, 3].set(0.0).at[:, 5].set(0.0))
  plan = selectors.select(graph, params, ratio=0.25, importance='l2', constraint=EXACT)
  # channel 3 and 5 of h1 only keep their w2 rows; not necessarily the smallest, so
  # compare with a numpy L2 over w1 columns and w2 rows.
  norms = np.sqrt(
    np.square(np.asarray(params['w1'])).sum(0) + np.square(np.asarray(params['w2'])).sum(1)
  )
  np.testing.assert_array_equal(plan.removed[h1], np.sort(np.argsort(norms)[:2]))
  assert jnp.shape(plan.removed[h2]) == (2,)


def test_density_removes_channels_already_dead_after_magnitude_pruning():
  graph, params, h1, h2 = _mlp()
  # unstructured pruning left h1 channels 2 and 6 with no nonzero weight.
  dead = dict(
    params, w1=params['w1'].at[:, [2, 6]].set(0.0), w2=params['w2'].at[[2, 6], :].set(0.0)
  )
  plan = selectors.select(graph, dead, ratio=0.25, importance='density', constraint=EXACT)
  np.testing.assert_array_equal(plan.removed[h1], [2, 6])
  assert 'group' in plan.summary() and plan.summary().endswith('removed 4 of 60 channels')


def test_make_plan_reads_a_boolean_mask_of_the_group_size_as_a_mask():
  graph = _graph(16, 4)
  plan = make_plan(graph, {0: [True] * 3 + [False] * 13})
  np.testing.assert_array_equal(plan.removed[0], [0, 1, 2])
  plan = make_plan(graph, {1: np.array([False, True, False, True])})
  np.testing.assert_array_equal(plan.removed[1], [1, 3])
  with pytest.raises(
    ValueError,
    match=r'group 0: a boolean mask needs one entry per channel '
    r'\(shape \(16,\)\), got shape \(3,\)',
  ):
    make_plan(graph, {0: [True, False, True]})
  with pytest.raises(TypeError, match='group 1: give channel indices'):
    make_plan(graph, {1: [0.5, 1.0]})


def test_importance_for_a_group_that_does_not_exist_is_an_error():
  graph, params, h1, h2 = _mlp()
  with pytest.raises(
    ValueError,
    match=rf'group id\(s\) \[99\] do not exist.*prunable groups are '
    rf'\[{min(h1, h2)}, {max(h1, h2)}\]',
  ):
    selectors.select(graph, params, ratio=0.5, importance={99: np.ones(8)})


@pytest.mark.parametrize(
  'locked, error, match',
  [
    (('(',), ValueError, r"locked\[0\]='\(' is not a valid regex"),
    ('head', TypeError, "locked='head': give a sequence of regexes"),
    ((3,), TypeError, r'locked\[0\]=3: each entry must be a regex string'),
  ],
)
def test_constraint_names_a_bad_locked_entry(locked, error, match):
  with pytest.raises(error, match=match):
    Constraint(locked=locked)
