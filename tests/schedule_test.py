"""The sparsity schedule and the mask-update gating.

See docs/explanation/semantics.md#schedule and #gating.
"""

import jax
import numpy as np
import pytest

import jaxprune
from jaxprune._config import hparams as hparams_lib
from jaxprune._config import schedule as schedule


def _spec_update_steps(begin, frequency, end, num_steps):
  """docs/explanation/semantics.md#gating, step by step: the steps at which masks are recomputed."""
  last, updates = 0, []
  for t in range(num_steps):
    if t >= begin and (end < 0 or t <= end) and last + frequency <= t:
      last = t
      updates.append(t)
  return updates


WINDOWS = [(0, 10, -1), (0, 1, -1), (5, 2, 9), (1, 2, 6), (30, 7, -1), (3, 20, 60), (0, 4, 4)]


@pytest.mark.parametrize('begin, frequency, end', WINDOWS)
def test_gating_and_its_consequences_follow_spec(begin, frequency, end):
  h = hparams_lib.HParams(
    begin_pruning_step=begin,
    pruning_frequency=frequency,
    end_pruning_step=end,
    sparsity_function_end_step=end if end > 0 else 1000,
  )
  expected = _spec_update_steps(begin, frequency, end, 80)
  should = jax.jit(lambda t, last: schedule.should_update(h, t, last))
  last, fired = 0, []
  for t in range(80):
    if bool(should(t, last)):
      last = t
      fired.append(t)
  assert fired == expected
  assert schedule.first_update_step(h) == expected[0]
  for num_steps in (1, expected[0], expected[0] + 1, 80):
    within = [t for t in expected if t < num_steps]
    assert schedule.final_update_step(h, num_steps) == (within[-1] if within else None)


def test_polynomial_sparsity_by_hand():
  # s(t) = target + (initial - target) * (1 - p) ** exponent, p clipped to [0, 1].
  values = [
    float(
      schedule.polynomial_sparsity(
        t, initial=0.1, target=0.9, begin_step=10, end_step=30, exponent=2.0
      )
    )
    for t in (0, 10, 20, 30, 40)
  ]
  # p = 0, 0, 0.5, 1, 1: 0.9 - 0.8 * (1, 1, 0.25, 0, 0).
  np.testing.assert_allclose(values, [0.1, 0.1, 0.7, 0.9, 0.9], rtol=1e-6)


def test_per_leaf_target_follows_the_same_curve():
  hp = jaxprune.parse_hparams(
    'initial_sparsity=0.2,sparsity_function_end_step=10,sparsity_function_exponent=1'
  )
  # Linear from 0.2 to the leaf's own 0.6: halfway at step 5 is 0.4.
  assert float(schedule.sparsity_at(hp, 5, target=0.6)) == pytest.approx(0.4, abs=1e-7)


def test_window_problems_name_each_cause():
  hp = jaxprune.get_pruning_hparams()
  assert schedule.window_problems(hp) == []
  hp.end_pruning_step = 50  # stops before the schedule's end at 100
  (stops,) = schedule.window_problems(hp)
  assert stops.startswith('end_pruning_step=50 stops mask updates')
  hp.end_pruning_step, hp.begin_pruning_step = -1, 150  # starts after it
  (starts,) = schedule.window_problems(hp)
  assert 'max(begin_pruning_step, pruning_frequency) = 150' in starts
