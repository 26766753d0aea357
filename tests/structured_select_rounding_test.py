"""A ratio is never exceeded: kept counts round up (as Torch-Pruning's
round_to does) and the plan's summary says when rounding kept more."""

import flax.linen as nn
import jax
import numpy as np

import jaxprune.structured as jps


class SeparableCNN(nn.Module):
  """Conv 16 -> depthwise 3x3 -> pointwise 8 -> mean -> Dense 3."""

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(16, (3, 3), name='stem')(x))
    x = nn.relu(nn.Conv(16, (3, 3), feature_group_count=16, name='depthwise')(x))
    x = nn.Conv(8, (1, 1), name='pointwise')(x)
    return nn.Dense(3, name='head')(x.mean((1, 2)))


def _dead_channels():
  """The model with stem channels 2, 5, 11, 13 dead (all their weights zero)."""
  x = jax.random.normal(jax.random.key(1), (2, 8, 8, 3))
  variables = jax.tree.map(np.array, SeparableCNN().init(jax.random.key(0), x))
  dead = [2, 5, 11, 13]
  params = variables['params']
  params['stem']['kernel'][..., dead] = 0
  params['stem']['bias'][dead] = 0
  params['depthwise']['kernel'][..., dead] = 0
  params['depthwise']['bias'][dead] = 0
  params['pointwise']['kernel'][:, :, dead] = 0
  return x, variables, dead


def test_ratio_removes_the_dead_channels_and_nothing_else():
  x, variables, dead = _dead_channels()
  graph = jps.trace(SeparableCNN().apply, variables, x)
  (stem,) = [g for g in graph.prunable_groups if g.size == 16]
  plan = jps.select(graph, variables, ratio=0.25)
  # floor(0.25 * 16) = 4 of the 16, floor(0.25 * 8) = 2 of the 8 pointwise outputs.
  assert plan.removed[stem.id].tolist() == dead
  assert plan.num_removed == 6 and 'rounded' not in plan.summary()
  new_variables, pruned_fn = jps.apply_plan(graph, variables, plan)
  assert new_variables['params']['stem']['kernel'].shape == (3, 3, 3, 12)
  # The dead channels gave exactly 0: only the 2 pointwise channels change the output.
  only_stem = jps.make_plan(graph, {stem.id: dead})
  new_stem, stem_fn = jps.apply_plan(graph, variables, only_stem)
  np.testing.assert_allclose(
    stem_fn(new_stem, x), SeparableCNN().apply(variables, x), rtol=1e-5, atol=1e-6
  )


def test_rounding_up_never_exceeds_the_ratio_and_says_so():
  x, variables, _ = _dead_channels()
  graph = jps.trace(SeparableCNN().apply, variables, x)
  sizes = sorted(g.size for g in graph.prunable_groups)
  assert sizes == [8, 16]
  rounded = jps.select(graph, variables, ratio=0.25, constraint=jps.Constraint(round_to=8))
  # 16 - 4 = 12 kept rounds up to 16; 8 - 2 = 6 rounds up to 8: nothing goes.
  assert rounded.num_removed == 0
  summary = rounded.summary()
  assert 'removed 0 of ' in summary and '(nothing removed)' in summary
  assert 'rounded up to a multiple of round_to=8' in summary
  assert '16 -> 16, not 12' in summary and '8 -> 8, not 6' in summary
  # At 0.5: 8 of 16 kept is a multiple of 8 and honoured; 4 of 8 rounds up to 8.
  half = jps.select(graph, variables, ratio=0.5, constraint=jps.Constraint(round_to=8))
  assert sorted(len(r) for r in half.removed.values()) == [8]
  for ratio in (0.1, 0.3, 0.45, 0.7, 0.9):
    for round_to in (1, 3, 4, 8):
      plan = jps.select(graph, variables, ratio=ratio, constraint=jps.Constraint(round_to=round_to))
      for gid, removed in plan.removed.items():
        assert len(removed) <= ratio * graph.groups[gid].size + 1e-9


def test_global_ratio_and_count_are_never_exceeded():
  x, variables, _ = _dead_channels()
  graph = jps.trace(SeparableCNN().apply, variables, x)
  for amount, most in ((0.3, 7), (0.5, 12), (5, 5)):  # of 24 candidate channels
    kwargs = (
      {'n_channels': amount} if isinstance(amount, int) else {'ratio': amount, 'scope': 'global'}
    )
    assert jps.select(graph, variables, **kwargs).num_removed == most
    rounded = jps.select(graph, variables, constraint=jps.Constraint(round_to=8), **kwargs)
    assert rounded.num_removed <= most
    if rounded.num_removed < most:
      assert f'of the {most} channels asked for (never more)' in rounded.summary()
