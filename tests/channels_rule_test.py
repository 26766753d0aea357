"""Gradual channel pruning in the transform: scores, thresholds, schedule, decay, constraints.

Expected channels come from scores written out by hand (each group's members
listed here, not read from the graph) and from the numbers of
docs/explanation/semantics.md#reference-numbers or the numpy references of `references`.
"""

from __future__ import annotations

import functools
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import references

import jaxprune
from jaxprune.channels import ChannelRule
from jaxprune.structured import Constraint, trace

F32 = np.float32


def _two_layer(hidden_scores, inputs=1):
  """relu(x @ w1 + b1) @ w2: one group of len(hidden_scores) channels whose
  L2 score is hidden_scores[c] (w1[0, c] holds it; b1 and w2 are zero)."""
  hidden = len(hidden_scores)
  params = {
    'w1': np.zeros((inputs, hidden), F32),
    'b1': np.zeros(hidden, F32),
    'w2': np.zeros((hidden, 1), F32),
  }
  params['w1'][0] = hidden_scores
  return _FN, jax.tree.map(jnp.asarray, params), _two_layer_graph(hidden, inputs)


def _FN(p, x):
  return jax.nn.relu(x @ p['w1'] + p['b1']) @ p['w2']


@functools.cache
def _two_layer_graph(hidden, inputs):
  # One graph per shape, so that tests on the same shapes share compilations.
  params = {
    'w1': jnp.zeros((inputs, hidden)),
    'b1': jnp.zeros(hidden),
    'w2': jnp.zeros((hidden, 1)),
  }
  return trace(_FN, params, jnp.ones((2, inputs)))


def _hparams(**overrides):
  hparams = jaxprune.get_pruning_hparams()
  hparams.update({'pruning_frequency': 1, **overrides})
  return hparams


_STEPS = {}


def _stepper(graph, hparams, constraint, scheduled):
  """The rule and its jitted update, made once per graph, hparams and constraint.

  The sparsity at each step comes in as an argument, so the runs of one test
  at several sparsities share one compilation.
  """
  key = (id(graph), hparams.to_json(), repr(constraint), scheduled)
  if key not in _STEPS:
    rule = ChannelRule(graph, constraint=constraint)

    def update(grads, state, params, sparsities):
      sparsity_fn = None if scheduled else (lambda t: sparsities[t])
      tx = jaxprune.pruning(hparams, sparsity_fn=sparsity_fn, mask_rule=rule)
      return tx.update(grads, state, params)

    _STEPS[key] = (graph, rule, jax.jit(update))
  return _STEPS[key][1:]


def _run(graph, params, hparams, steps, constraint=None, sparsities=None, grads=None):
  """Zero gradients through the transform; (kept channels of each group, states) per step.

  `sparsities`: the target at each step (a number: the same at every step);
  None follows the schedule of `hparams`.
  """
  rule, step = _stepper(graph, hparams, constraint or Constraint(round_to=1), sparsities is None)
  state = jaxprune.pruning(hparams, mask_rule=rule).init(params)
  by_step = jnp.broadcast_to(
    jnp.asarray(0.0 if sparsities is None else sparsities, jnp.float32), (steps,)
  )
  states = []
  for t in range(steps):
    updates, state = step(
      grads[t] if grads else jax.tree.map(jnp.zeros_like, params), state, params, by_step
    )
    params = optax.apply_updates(params, updates)
    states.append(state)
  kept = [jaxprune.channels.channel_masks(rule, s) for s in states]
  return rule, params, states, kept


def _by_label(rule, kept):
  """{group label: channel mask} from channel_masks' {group id: channel mask}."""
  return {g.label: kept[g.id] for g in rule.layout.groups}


@pytest.mark.slow
def test_exact_and_histogram_keep_the_reference_channels():
  scores = np.asarray([3.0, 1.0, 4.0, 1.5, 9.0, 2.0, 6.0, 5.0], F32)
  _, params, graph = _two_layer(scores)
  for method, sparsity in [
    ('exact', 0.5),
    ('exact', 0.3),
    ('histogram', 0.5),
    ('histogram', 0.3),
    ('histogram', 0.9),
  ]:
    _, _, states, kept = _run(
      graph, params, _hparams(threshold_method=method), 2, sparsities=sparsity
    )
    threshold, mask = references.threshold_and_mask(scores, sparsity, 256, method)
    np.testing.assert_array_equal(kept[1][0], mask, err_msg=f'{method} {sparsity}')
    assert float(jaxprune.get_thresholds(states[1])['w1:1']) == threshold
    assert kept[0][0].all()  # step 0 is no mask update (frequency 1 counts from step 0)


@pytest.mark.slow
def test_mask_covers_every_member_slice():
  scores = np.asarray([1.0, 5.0, 2.0, 4.0], F32)
  _, params, graph = _two_layer(scores, inputs=3)
  params['b1'] = jnp.ones(4)
  params['w2'] = jnp.ones((4, 1))
  # scores become sqrt(s**2 + 1 + 1): same order; exact 0.5 keeps channels 1 and 3.
  _, new_params, states, _ = _run(
    graph, params, _hparams(threshold_method='exact'), 2, sparsities=0.5
  )
  masks = jaxprune.get_masks(states[1])
  np.testing.assert_array_equal(masks['w1'], np.tile([[0, 1, 0, 1]], (3, 1)).astype(bool))
  np.testing.assert_array_equal(masks['b1'], [0, 1, 0, 1])
  np.testing.assert_array_equal(masks['w2'], [[0], [1], [0], [1]])
  np.testing.assert_array_equal(new_params['b1'], [0, 1, 0, 1])
  np.testing.assert_array_equal(new_params['w2'][:, 0], [0, 1, 0, 1])


class _BNNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(
      nn.BatchNorm(use_running_average=True, name='bn1')(nn.Conv(6, (3, 3), name='conv1')(x))
    )
    x = nn.relu(
      nn.BatchNorm(use_running_average=True, name='bn2')(nn.Conv(4, (3, 3), name='conv2')(x))
    )
    return nn.Dense(3, name='head')(jnp.mean(x, axis=(1, 2)))


@pytest.mark.slow
def test_scores_are_the_l2_norm_of_the_whole_group():
  x = jnp.ones((1, 5, 5, 2))
  model = _BNNet()
  variables = model.init(jax.random.key(0), x)
  rng = np.random.default_rng(0)
  params = jax.tree.map(
    lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), variables['params']
  )
  variables = {**variables, 'params': params}
  graph = trace(model.apply, variables, x)
  p = jax.tree.map(np.asarray, params)
  # Written out by hand: what each conv's output channel c owns.
  conv1 = np.sqrt(
    np.sum(p['conv1']['kernel'] ** 2, axis=(0, 1, 2))
    + p['conv1']['bias'] ** 2
    + p['bn1']['scale'] ** 2
    + p['bn1']['bias'] ** 2
    + np.sum(p['conv2']['kernel'] ** 2, axis=(0, 1, 3))
  )
  conv2 = np.sqrt(
    np.sum(p['conv2']['kernel'] ** 2, axis=(0, 1, 2))
    + p['conv2']['bias'] ** 2
    + p['bn2']['scale'] ** 2
    + p['bn2']['bias'] ** 2
    + np.sum(p['head']['kernel'] ** 2, axis=1)
  )
  for sparsity in (0.3, 0.5, 0.7):
    rule, new_params, states, kept = _run(
      graph, params, _hparams(threshold_method='exact'), 2, sparsities=sparsity
    )
    by_label = _by_label(rule, kept[1])
    for label, score in (('conv1/kernel:3', conv1), ('conv2/kernel:3', conv2)):
      _, mask = references.threshold_and_mask(score.astype(F32), sparsity, 256, 'exact')
      np.testing.assert_array_equal(by_label[label], mask, err_msg=f'{label} {sparsity}')
    # Every slice of a removed conv1 channel is zero: filter, bias, BN entries, conv2 rows.
    gone = ~by_label['conv1/kernel:3']
    assert gone.any()
    for leaf, axis in (
      ('conv1/kernel', 3),
      ('conv1/bias', 0),
      ('bn1/scale', 0),
      ('bn1/bias', 0),
      ('conv2/kernel', 2),
    ):
      module, name = leaf.split('/')
      value = np.moveaxis(np.asarray(new_params[module][name]), axis, 0)
      if leaf == 'conv2/kernel':  # its own output channels (last axis) are pruned too
        value = value[..., by_label['conv2/kernel:3']]
      assert not value[gone].any() and value[~gone].all(), leaf


def test_gating_follows_spec_reference():
  # docs/explanation/semantics.md#reference-numbers (gating): frequency 2, begin 1, end 6, s(t) =
  # linspace(0, .9, 10)[t].
  scores = np.arange(1, 11, dtype=F32)
  _, params, graph = _two_layer(scores)
  schedule = jnp.linspace(0.0, 0.9, 10)
  hparams = _hparams(
    pruning_frequency=2, begin_pruning_step=1, end_pruning_step=6, threshold_method='exact'
  )
  _, _, states, kept = _run(graph, params, hparams, 10, sparsities=schedule)
  assert [int(k[0].sum()) for k in kept] == [10, 10, 8, 8, 6, 6, 4, 4, 4, 4]
  assert [int(s.last_update_step) for s in states] == [0, 0, 2, 2, 4, 4, 6, 6, 6, 6]
  np.testing.assert_array_equal(kept[-1][0], scores > 6)


def test_polynomial_schedule_removes_channels_gradually():
  scores = np.arange(1, 17, dtype=F32)
  _, params, graph = _two_layer(scores)
  hparams = _hparams(target_sparsity=0.75, sparsity_function_end_step=8, threshold_method='exact')
  _, _, _, kept = _run(graph, params, hparams, 10)
  # s(t) = 0.75 (1 - (1 - t/8)^3); kept = round(16 (1 - s(t))), by hand.
  expected = [16] + [round(16 * (1 - 0.75 * (1 - (1 - t / 8) ** 3))) for t in range(1, 9)] + [4]
  assert [int(k[0].sum()) for k in kept] == expected
  # 16 (1 - s(t)) for t = 1..4: 12.04, 9.06, 6.93, 5.5 (round half to even: 6).
  assert expected[1:5] == [12, 9, 7, 6]


def test_decay_follows_spec_reference():
  # docs/explanation/semantics.md#reference-numbers: decay 0.9, s = 0.5, linspace(1, 100, 100):
  # (threshold, nonzero) per update.
  _, params, graph = _two_layer(np.linspace(1, 100, 100).astype(F32))
  hparams = _hparams(threshold_decay=0.9)
  _, _, states, kept = _run(graph, params, hparams, 6, sparsities=0.5)
  thresholds = [float(jaxprune.get_thresholds(s)['w1:1']) for s in states[1:]]
  np.testing.assert_allclose(thresholds, [5.0, 9.5, 13.55, 17.195, 20.4755], rtol=1e-6)
  assert [int(k[0].sum()) for k in kept[1:]] == [95, 91, 87, 83, 80]


@pytest.mark.parametrize(
  'sparsity, round_to, min_channels, kept',
  [
    (0.6, 4, 1, 8),  # keeps round(6.4) = 6: 4 and 8 are as near, ties keep more
    (0.7, 4, 1, 4),  # keeps round(4.8) = 5: 4 is nearest
    (0.9, 1, 6, 6),  # keeps round(1.6) = 2: at least 6 stay
    (0.1, 8, 1, 16),  # keeps round(14.4) = 14: 16 (the whole group) is nearer than 8
  ],
)
def test_constraint_applies_after_the_threshold(sparsity, round_to, min_channels, kept):
  scores = np.asarray(np.random.default_rng(1).permutation(16) + 1, F32)
  _, params, graph = _two_layer(scores)
  constraint = Constraint(round_to=round_to, min_channels=min_channels)
  _, _, _, masks = _run(
    graph, params, _hparams(threshold_method='exact'), 2, constraint=constraint, sparsities=sparsity
  )
  np.testing.assert_array_equal(masks[1][0], scores > 16 - kept)  # the highest scores stay


def _two_groups(a_scores, b_scores):
  params = {
    'w1': np.asarray([a_scores], F32),
    'w2': np.zeros((len(a_scores), 1), F32),
    'v1': np.asarray([b_scores], F32),
    'v2': np.zeros((len(b_scores), 1), F32),
  }
  fn = lambda p, x: jax.nn.relu(x @ p['w1']) @ p['w2'] + jax.nn.relu(x @ p['v1']) @ p['v2']
  return jax.tree.map(jnp.asarray, params), trace(fn, params, jnp.ones((2, 1)))


@pytest.mark.slow
def test_global_threshold_ranks_mean_normalised_scores():
  # Normalised: a = [.4, .8, 1.2, 1.6], b = [.5, .5, .5, 2.5]; the 4 largest of the 8 stay.
  params, graph = _two_groups([1.0, 2.0, 3.0, 4.0], [100.0, 100.0, 100.0, 500.0])
  rule, _, states, kept = _run(
    graph, params, _hparams(threshold_method='exact', global_pruning=True), 2, sparsities=0.5
  )
  kept = _by_label(rule, kept[1])
  np.testing.assert_array_equal(kept['w1:1'], [False, True, True, True])
  np.testing.assert_array_equal(kept['v1:1'], [False, False, False, True])
  thresholds = jaxprune.get_thresholds(states[1])
  assert float(thresholds['w1:1']) == float(thresholds['v1:1']) == F32(2.0) / F32(2.5)
  # Per group instead: w1 keeps its 2 largest; v1's 2nd largest score, 100, is also
  # its 3rd and 4th, and exact keeps scores >= the threshold, so v1 keeps all 4.
  rule, _, _, kept = _run(graph, params, _hparams(threshold_method='exact'), 2, sparsities=0.5)
  kept = _by_label(rule, kept[1])
  np.testing.assert_array_equal(kept['w1:1'], [False, False, True, True])
  assert kept['v1:1'].all()


@pytest.mark.slow
def test_locked_groups_keep_every_channel():
  params, graph = _two_groups([1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0])
  rule, _, states, kept = _run(
    graph,
    params,
    _hparams(threshold_method='exact'),
    2,
    constraint=Constraint(round_to=1, locked=('v1',)),
    sparsities=0.5,
  )
  assert [g.label for g in rule.layout.groups] == ['w1:1']
  np.testing.assert_array_equal(kept[1][rule.layout.groups[0].id], [False, False, True, True])
  masks = jaxprune.get_masks(states[1])
  assert masks['v1'] is None and masks['v2'] is None


def test_nonfinite_group_keeps_its_mask_and_is_counted():
  params, graph = _two_groups([1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0])
  grads = [jax.tree.map(jnp.zeros_like, params) for _ in range(3)]
  grads[2] = {**grads[2], 'v1': jnp.asarray([[0.0, jnp.nan, 0.0, 0.0]])}
  # Plain SGD: the NaN gradient reaches v1 = params + updates at step 2's mask update.
  hparams = _hparams(threshold_method='exact')
  rule = ChannelRule(graph, constraint=Constraint(round_to=1))
  tx = optax.chain(
    optax.sgd(1.0), jaxprune.pruning(hparams, sparsity_fn=lambda t: 0.25 * t, mask_rule=rule)
  )
  state = tx.init(params)
  kept = []
  step = jax.jit(tx.update)
  for g in grads:
    updates, state = step(g, state, params)
    params = optax.apply_updates(params, updates)
    kept.append(_by_label(rule, jaxprune.channels.channel_masks(rule, state)))
  pruning_state = jaxprune.find_pruning_state(state)
  assert int(pruning_state.nonfinite_skips) == 1
  # Step 1 (s = 0.25) kept 3 of each; at step 2 (s = 0.5) w1 keeps 2, v1 keeps its 3.
  assert {k: int(m.sum()) for k, m in kept[1].items()} == {'w1:1': 3, 'v1:1': 3}
  assert {k: int(m.sum()) for k, m in kept[2].items()} == {'w1:1': 2, 'v1:1': 3}


def test_masks_are_bool_trees_parallel_to_the_params_and_jit_compiles_once():
  _, params, graph = _two_layer(np.arange(1, 9, dtype=F32))
  rule = ChannelRule(graph)
  tx = optax.chain(optax.adam(1e-2), jaxprune.pruning(_hparams(), mask_rule=rule))
  state = tx.init(params)
  traces = []

  @jax.jit
  def step(params, state):
    traces.append(1)
    grads = jax.tree.map(jnp.ones_like, params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for _ in range(5):
    params, state = step(params, state)
  assert len(traces) == 1
  masks = jaxprune.get_masks(state)
  assert jax.tree.structure(masks, is_leaf=lambda x: x is None) == jax.tree.structure(params)
  assert all(m.dtype == bool and m.shape == params[k].shape for k, m in masks.items())


def test_summaries_name_group_thresholds():
  _, params, graph = _two_layer(np.arange(1, 9, dtype=F32))
  _, _, states, _ = _run(graph, params, _hparams(threshold_method='exact'), 2, sparsities=0.5)
  summary = jaxprune.summaries(states[1])
  assert float(summary['w1:1/threshold']) == 5.0
  assert float(summary['w1/sparsity']) == 0.5 and float(summary['w2/sparsity']) == 0.5


@pytest.mark.parametrize(
  'field, value',
  [
    ('weight_sparsity_map', ['w1:0.5']),
    ('block_height', 2),
    ('nm_sparsity', '2:4'),
    ('layer_axes_map', ['w1:1']),
    ('weight_name_regex', 'w'),
    ('block_dims_map', ['w1:2x2']),
    # Set by the user at their defaults' values: still settings the channels would ignore.
    ('weight_name_regex', '(kernel|embedding)$'),
    ('block_height', 1),
  ],
)
def test_settings_that_do_not_apply_to_channels_are_refused(field, value):
  _, _, graph = _two_layer(np.arange(1, 9, dtype=F32))
  with pytest.raises(ValueError, match=field.split('/')[0]):
    jaxprune.pruning(_hparams(**{field: value}), mask_rule=ChannelRule(graph))


def test_bad_arguments_are_named():
  _, params, graph = _two_layer(np.arange(1, 9, dtype=F32))
  rule = ChannelRule(graph)
  with pytest.raises(ValueError, match='prune_filter'):
    jaxprune.pruning(_hparams(), mask_rule=rule, prune_filter=lambda n, x: True)
  with pytest.raises(TypeError, match='DependencyGraph'):
    ChannelRule(params)
  with pytest.raises(TypeError, match='Constraint'):
    ChannelRule(graph, constraint={'round_to': 1})
  with pytest.raises(ValueError, match="params='batch_stats'"):
    ChannelRule(graph, params='batch_stats')
  tx = jaxprune.pruning(_hparams(), mask_rule=rule)
  with pytest.raises(ValueError, match='not the traced params'):
    tx.init({'other': params['w1']})
  with pytest.raises(ValueError, match="'w1' has shape"):
    tx.init({**params, 'w1': jnp.zeros((2, 8))})
  elementwise = jaxprune.pruning(_hparams()).init(params)
  with pytest.raises(ValueError, match='not made by this ChannelRule'):
    jaxprune.channels.plan(rule, elementwise)


def test_groups_with_weights_outside_the_params_are_skipped_with_a_warning():
  params = {'w1': jnp.ones((1, 4)), 'w2': jnp.ones((4, 1))}
  variables = {'params': params, 'frozen': {'w2': jnp.ones((4, 1))}}
  fn = lambda v, x: jax.nn.relu(x @ v['params']['w1']) @ (v['params']['w2'] + v['frozen']['w2'])
  graph = trace(fn, variables, jnp.ones((2, 1)))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    rule = ChannelRule(graph)
  assert rule.layout.groups == () and 'frozen/w2' in str(caught[0].message)
