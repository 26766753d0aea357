"""Channel importance on hand-made groups; expected numbers worked out by hand."""

import types

import jax.numpy as jnp
import numpy as np
import pytest

from jaxprune.structured import ChannelGroup, Member
from jaxprune.structured._select import importance


def _graph():
  """Group 0: Dense_0 output (3 channels) = kernel axis 1, bias, BN, Dense_1 rows.

  Group 1: a merged axis: 2 channels own positions {0, 2} and {1, 3} of w2 axis 0.
  """
  plain = np.arange(3).reshape(3, 1)
  g0 = ChannelGroup(
    0,
    3,
    [
      Member('params/Dense_0/kernel', 1, plain),
      Member('params/Dense_0/bias', 0, plain),
      Member('params/bn/scale', 0, plain),
      Member('batch_stats/bn/mean', 0, plain),
      Member('params/Dense_1/kernel', 0, plain),
    ],
    True,
    None,
    10.0,
  )
  g1 = ChannelGroup(1, 2, [Member('w2', 0, np.array([[0, 2], [1, 3]]))], True, None, 4.0)
  return types.SimpleNamespace(groups=[g0, g1])


def _variables():
  return {
    'params': {
      'Dense_0': {
        'kernel': jnp.array([[1.0, -2.0, 0.0], [3.0, 0.0, 0.0]]),
        'bias': jnp.array([1.0, 0.0, 0.0]),
      },
      'bn': {'scale': jnp.array([0.5, -4.0, 1.0])},
      'Dense_1': {'kernel': jnp.array([[1.0, 1.0], [0.0, 2.0], [0.0, 0.0]])},
    },
    'batch_stats': {'bn': {'mean': jnp.array([100.0, 100.0, 100.0])}},
    'w2': jnp.array([[1.0], [2.0], [3.0], [4.0]]),
  }


def test_l1_sums_every_weight_member_and_skips_statistics():
  scores = importance.magnitude_importance(_graph(), _variables(), p=1)
  # channel 0: |1|+|3| + |1| + |0.5| + |1|+|1| = 7.5; channel 1: 2+0+4+0+2 = 8; channel 2: 1.
  raw = np.array([7.5, 8.0, 1.0])
  np.testing.assert_allclose(scores[0], raw / raw.mean())
  # merged axis: channel 0 owns rows 0 and 2 -> 1 + 3; channel 1 owns rows 1 and 3 -> 2 + 4.
  np.testing.assert_allclose(scores[1], np.array([4.0, 6.0]) / 5.0)


def test_l2_is_the_norm_of_all_slices_together():
  scores = importance.magnitude_importance(_graph(), _variables(), p=2)
  raw = np.sqrt([1 + 9 + 1 + 0.25 + 1 + 1, 4 + 0 + 16 + 0 + 4, 1])
  np.testing.assert_allclose(scores[0], raw / raw.mean())
  np.testing.assert_allclose(np.mean(scores[0]), 1.0)


def test_bn_scale_uses_scale_and_falls_back_to_l2():
  scores = importance.bn_scale_importance(_graph(), _variables())
  np.testing.assert_allclose(scores[0], np.array([0.5, 4.0, 1.0]) / (5.5 / 3))
  l2 = np.sqrt([1 + 9, 4 + 16])
  np.testing.assert_allclose(scores[1], l2 / l2.mean())


def test_density_from_zeros_and_from_masks():
  variables = _variables()
  scores = importance.density_importance(_graph(), variables)
  # nonzero entries / entries over kernel col (2), bias (1), scale (1), Dense_1 row (2).
  np.testing.assert_allclose(scores[0], [6 / 6, 3 / 6, 1 / 6])
  masks = {'Dense_1': {'kernel': np.array([[0, 0], [0, 0], [1, 1]], bool)}}
  scores = importance.density_importance(_graph(), variables, masks)
  # the mask replaces Dense_1's weights: channel 0 loses 2 nonzeros, channel 2 gains 2.
  np.testing.assert_allclose(scores[0], [4 / 6, 2 / 6, 3 / 6])


def test_taylor_is_mean_abs_weight_times_gradient():
  graph = types.SimpleNamespace(
    groups=[ChannelGroup(0, 2, [Member('w', 1, np.arange(2).reshape(2, 1))], True, None, 1.0)]
  )
  variables = {'w': jnp.array([[1.0, -2.0], [3.0, 4.0]])}
  # loss = sum(x @ w): dL/dw[i, j] = sum over batch of x[:, i].
  batches = [jnp.array([[1.0, 0.0]]), jnp.array([[0.0, 2.0]])]
  loss = lambda v, x: jnp.sum(x @ v['w'])
  scores = importance.taylor_importance(graph, variables, loss, batches)
  # batch 1: |w * [[1],[0]]| -> col sums [1, 2]; batch 2: |w * [[0],[2]]| -> [6, 8].
  raw = (np.array([1.0, 2.0]) + np.array([6.0, 8.0])) / 2
  np.testing.assert_allclose(scores[0], raw / raw.mean(), rtol=1e-6)
  with pytest.raises(ValueError, match='at least one calibration batch'):
    importance.taylor_importance(graph, variables, loss, [])


def test_random_is_seeded_and_dispatch_validates():
  graph = _graph()
  a = importance.score_channels(graph, _variables(), 'random', seed=3)
  b = importance.score_channels(graph, _variables(), 'random', seed=3)
  np.testing.assert_array_equal(a[0], b[0])
  assert a[0].shape == (3,) and a[1].shape == (2,)
  given = importance.score_channels(graph, _variables(), {0: [3.0, 2.0, 1.0]})
  np.testing.assert_array_equal(given[0], [3.0, 2.0, 1.0])
  with pytest.raises(ValueError, match=r'importance\[0\]: shape \(2,\)'):
    importance.score_channels(graph, _variables(), {0: [1.0, 2.0]})
  with pytest.raises(ValueError, match="importance='l3'"):
    importance.score_channels(graph, _variables(), 'l3')
  with pytest.raises(ValueError, match='p=3'):
    importance.magnitude_importance(graph, _variables(), p=3)


def test_all_zero_group_scores_zero_not_nan():
  graph = types.SimpleNamespace(
    groups=[ChannelGroup(0, 2, [Member('w', 0, np.arange(2).reshape(2, 1))], True, None, 1.0)]
  )
  scores = importance.magnitude_importance(graph, {'w': jnp.zeros((2, 3))})
  np.testing.assert_array_equal(scores[0], [0.0, 0.0])
